# The installable package (docs/install.md): `cmake --install build --prefix P` puts in place
#   bin/                       cxxlaunch, cxxlaunchd, cxxlaunch_selftest (`cxxlaunch test` runs the
#                              self-test found next to its own binary), finetune (and its
#                              finetune_tokenize), llama_init, tokenize (text/'s CLI)
#   include/cxxlaunch/         the public headers under their in-tree paths (runtime/..., common/...),
#                              so a trainer writes #include "runtime/accelerator.h" as ours do
#   lib/                       the static libraries: the runtime and ours that it links
#   lib/cmake/cxxlaunch/       the package config: find_package(cxxlaunch CONFIG), cxxlaunch::cxxlaunch
#                              (everything a trainer links) or cxxlaunch::runtime (no models/)
#   lib/pkgconfig/cxxlaunch.pc the same link line for other build systems (LibTorch's flags aside)
#   share/doc/cxxlaunch/       the user guide (docs/*.md)
# Everything is relocatable: the config and the .pc file find the prefix from where they lie.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(CXXLAUNCH_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/cxxlaunch)
set(CXXLAUNCH_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/cxxlaunch)
# Installed binaries keep the run paths of libraries outside the system's folders (CUDA's, a
# LibTorch unpacked elsewhere), which CMake strips by default.
# The user-facing programs: the launcher, the daemon, the self-test, and the fine-tuning tools
# (docs/finetune.md): finetune with its tokenizer process finetune_tokenize (finetune runs it from
# its own folder), llama_init, and tokenize (docs/text.md).
set(_cxxlaunch_programs cxxlaunch cxxlaunchd cxxlaunch_selftest finetune llama_init)
foreach(_optional finetune_tokenize tokenize)  # built where SentencePiece / PCRE2 and ICU are
  if(TARGET ${_optional})
    list(APPEND _cxxlaunch_programs ${_optional})
  endif()
endforeach()
set_target_properties(${_cxxlaunch_programs} PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS ${_cxxlaunch_programs} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The user guide, where the messages' "see docs/config.md" finds it: share/doc/cxxlaunch/.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} FILES_MATCHING
        PATTERN "*.md")

# The runtime and every library of ours it links, static: a user names cxxlaunch::runtime and
# CMake brings the rest, ours and the dependencies the config finds.
set(_cxxlaunch_libraries cxxlaunch_models cxxlaunch_runtime cxxlaunch_tensorfile
    cxxlaunch_observability cxxlaunch_kernels_cpu cxxlaunch_rendezvous cxxlaunch_proto cxxlaunch_common)
set(CXXLAUNCH_PACKAGE_WITH_CUDA OFF)
# text/ (tokenizer.json, chat templates, training data), torch-free: cxxlaunch::text, where built.
set(CXXLAUNCH_PACKAGE_WITH_TEXT OFF)
if(TARGET cxxlaunch_text)
  list(APPEND _cxxlaunch_libraries cxxlaunch_text)
  set(CXXLAUNCH_PACKAGE_WITH_TEXT ON)
endif()
if(TARGET cxxlaunch_cuda)
  list(APPEND _cxxlaunch_libraries cxxlaunch_cuda)
  set(CXXLAUNCH_PACKAGE_WITH_CUDA ON)
  find_package(CUDAToolkit REQUIRED)  # runtime/ found it in its own scope: its folders for below
endif()
foreach(_library IN LISTS _cxxlaunch_libraries)
  string(REGEX REPLACE "^cxxlaunch_" "" _name ${_library})
  set_target_properties(${_library} PROPERTIES EXPORT_NAME ${_name})
endforeach()
# The one target to name: cxxlaunch::cxxlaunch brings the runtime and the model families (models/
# links the runtime, so the runtime cannot bring models/ itself).
add_library(cxxlaunch_package INTERFACE)
target_link_libraries(cxxlaunch_package INTERFACE cxxlaunch_models cxxlaunch_runtime)
set_target_properties(cxxlaunch_package PROPERTIES EXPORT_NAME cxxlaunch)
install(TARGETS cxxlaunch_package ${_cxxlaunch_libraries} EXPORT cxxlaunchTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CXXLAUNCH_INSTALL_INCLUDEDIR})
install(EXPORT cxxlaunchTargets NAMESPACE cxxlaunch:: DESTINATION ${CXXLAUNCH_INSTALL_CMAKEDIR})

# The public API (docs/install.md#the-public-headers), listed here and nowhere else: the
# Accelerator, the settings it reads, what it reports, the unit handle (with activation
# checkpointing and deferred init), the errors, the models. Everything else (comm/, the
# strategies, heartbeat, checkpoint files) stays private behind the Accelerator's pimpl.
set(CXXLAUNCH_PUBLIC_HEADERS runtime/accelerator.h runtime/env.h runtime/reports.h
    runtime/strategy/unit.h common/error.h models/llama.h models/lora.h models/chunked_loss.h)
# text/'s, where built: a library of its own (cxxlaunch::text, no LibTorch) with its own API.
set(CXXLAUNCH_TEXT_HEADERS text/tokenizer.h text/chat_template.h text/sft_data.h text/packing.h
    text/token_cache.h)
# A public header may include only public headers of ours (checked here, at configure time):
# the installed set compiles on its own (tests/integration/installed_headers_test.sh).
function(cxxlaunch_check_public_headers allowed)
  foreach(_header IN LISTS ARGN)
    file(STRINGS "${PROJECT_SOURCE_DIR}/${_header}" _lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    foreach(_line IN LISTS _lines)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" _included "${_line}")
      if(NOT _included IN_LIST allowed)
        message(FATAL_ERROR "cxxlaunch: the public header ${_header} includes \"${_included}\", "
                            "which is not public (cmake/install.cmake lists the public headers)")
      endif()
    endforeach()
  endforeach()
endfunction()
cxxlaunch_check_public_headers("${CXXLAUNCH_PUBLIC_HEADERS}" ${CXXLAUNCH_PUBLIC_HEADERS})
set(_cxxlaunch_installed_headers ${CXXLAUNCH_PUBLIC_HEADERS})
if(CXXLAUNCH_PACKAGE_WITH_TEXT)
  cxxlaunch_check_public_headers("${CXXLAUNCH_TEXT_HEADERS}" ${CXXLAUNCH_TEXT_HEADERS})
  list(APPEND _cxxlaunch_installed_headers ${CXXLAUNCH_TEXT_HEADERS})
endif()
foreach(_header IN LISTS _cxxlaunch_installed_headers)
  get_filename_component(_folder "${_header}" DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${_header} DESTINATION ${CXXLAUNCH_INSTALL_INCLUDEDIR}/${_folder})
endforeach()

# The package config and its version (0.x: a minor version may break the interface).
get_filename_component(CXXLAUNCH_TORCH_DIR "${Torch_DIR}" ABSOLUTE)
get_filename_component(CXXLAUNCH_GLOO_DIR "${Gloo_DIR}" ABSOLUTE)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/cxxlaunchConfig.cmake.in
  ${CMAKE_BINARY_DIR}/cxxlaunchConfig.cmake INSTALL_DESTINATION ${CXXLAUNCH_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cxxlaunchConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cxxlaunchConfig.cmake
              ${CMAKE_BINARY_DIR}/cxxlaunchConfigVersion.cmake
        DESTINATION ${CXXLAUNCH_INSTALL_CMAKEDIR})

# pkg-config: the prefix is found from the .pc file's own folder (${pcfiledir}).
file(RELATIVE_PATH CXXLAUNCH_PC_TO_PREFIX "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
string(REGEX REPLACE "/$" "" CXXLAUNCH_PC_TO_PREFIX "${CXXLAUNCH_PC_TO_PREFIX}")
set(CXXLAUNCH_PC_LIBS
    "-lcxxlaunch_models -lcxxlaunch_runtime -lcxxlaunch_tensorfile -lcxxlaunch_observability -lcxxlaunch_kernels_cpu")
set(CXXLAUNCH_PC_DEPENDENCY_LIBS "-lgloo")
if(CXXLAUNCH_PACKAGE_WITH_CUDA)
  string(APPEND CXXLAUNCH_PC_LIBS " -lcxxlaunch_cuda")
  string(APPEND CXXLAUNCH_PC_DEPENDENCY_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -lcudart")
endif()
get_target_property(_runtime_links cxxlaunch_runtime LINK_LIBRARIES)
if(NCCL_LIBRARY AND NCCL_LIBRARY IN_LIST _runtime_links)
  string(APPEND CXXLAUNCH_PC_DEPENDENCY_LIBS " ${NCCL_LIBRARY}")
endif()
string(APPEND CXXLAUNCH_PC_LIBS " -lcxxlaunch_rendezvous -lcxxlaunch_proto -lcxxlaunch_common")
string(REPLACE ";" " " CXXLAUNCH_PC_TORCH_CXX_FLAGS "${TORCH_CXX_FLAGS}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/cxxlaunch.pc.in ${CMAKE_BINARY_DIR}/cxxlaunch.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/cxxlaunch.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
