# `cpack -G DEB` in the build folder: one Debian package, `cxxlaunch`, with what
# `cmake --install` puts in place, under /usr (docs/install.md).
#
# Its dependencies come from what it links: dpkg-shlibdeps reads the binaries' shared libraries
# and names the Debian packages that hold them (libtorch1.13, libgloo0, libgrpc++1.51,
# libprotobuf32, libyaml-cpp0.7, ...). The CMake package needs the -dev packages on top: the
# config finds LibTorch, Gloo, gRPC and Protobuf, and Debian's gRPC config refuses to load
# without grpc_cpp_plugin (protobuf-compiler-grpc).
#
# Debian's LibTorch is CPU-only, and CUDA and NCCL are no Debian packages: a package is made
# from a build with -DCXXLAUNCH_WITH_CUDA=OFF (scripts/package-deb.sh makes one).
set(CPACK_PACKAGE_NAME cxxlaunch)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "cxxlaunch maintainers <cxxlaunch@invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "launcher, rendezvous daemon and data-parallel runtime for LibTorch trainers")
set(CPACK_PACKAGE_DESCRIPTION
    "cxxlaunch launches one worker per GPU or CPU slot (like torchrun and accelerate launch), \
joins nodes through a gRPC rendezvous (cxxlaunchd) and gives trainers DDP, ZeRO and FSDP \
through the cxxlaunch_runtime library (find_package(cxxlaunch), pkg-config cxxlaunch).")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)  # merged with the list below
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libtorch-dev, libgloo-dev, libgrpc++-dev, libprotobuf-dev, protobuf-compiler-grpc")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "cmake, pkgconf")

# Read by cpack: a DEB from a CUDA build would name libraries no Debian package holds.
set(CPACK_CXXLAUNCH_WITH_CUDA ${CXXLAUNCH_PACKAGE_WITH_CUDA})
set(CPACK_PROJECT_CONFIG_FILE ${CMAKE_CURRENT_LIST_DIR}/cpack_project.cmake)
include(CPack)
