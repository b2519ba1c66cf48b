# Read by cpack for each generator (CPACK_PROJECT_CONFIG_FILE, cmake/packaging.cmake).
if(CPACK_GENERATOR STREQUAL "DEB" AND CPACK_CXXLAUNCH_WITH_CUDA)
  message(FATAL_ERROR "cxxlaunch: this build links CUDA and NCCL, which no Debian package "
                      "provides; make the Debian package from a build configured with "
                      "-DCXXLAUNCH_WITH_CUDA=OFF (scripts/package-deb.sh does)")
endif()
