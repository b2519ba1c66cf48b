# A build against a bundle (scripts/gpu-bundle.sh): for a machine without Debian's -dev packages,
# such as the GPU machine of scripts/gpu-check.sh. The bundle holds the launcher and the daemon
# prebuilt, the rendezvous library prebuilt (the runtime's store client: gRPC and Protobuf come
# with it as shared libraries, never as headers), and the headers and libraries of Gloo,
# nlohmann-json, Catch2 and CLI11. Everything else (LibTorch, CUDA, NCCL) is the machine's own.
# Only common/, the runtime, its apps, benchmarks and tests are built; the launcher, the
# rendezvous and their tests are not (the prebuilt rendezvous library links the common/ built
# here).

set(_bundle "${CXXLAUNCH_BUNDLE}")
foreach(_needed bin/cxxlaunch bin/cxxlaunchd lib/libcxxlaunch_rendezvous.a lib/libcxxlaunch_proto.a
        lib/libgloo.so.0 include/gloo/config.h include/nlohmann/json.hpp include/catch2/catch.hpp
        cmake/Catch.cmake)
  if(NOT EXISTS "${_bundle}/${_needed}")
    message(FATAL_ERROR "CXXLAUNCH_BUNDLE=${_bundle} has no ${_needed}: make it with "
                        "scripts/gpu-bundle.sh on a machine with the Debian packages")
  endif()
endforeach()

# Header-only libraries, and Gloo.
add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
add_library(Catch2::Catch2 INTERFACE IMPORTED)
add_library(CLI11::CLI11 INTERFACE IMPORTED)
set_target_properties(nlohmann_json::nlohmann_json Catch2::Catch2 CLI11::CLI11 PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${_bundle}/include")
add_library(gloo SHARED IMPORTED)
set_target_properties(gloo PROPERTIES IMPORTED_LOCATION "${_bundle}/lib/libgloo.so.0"
  INTERFACE_INCLUDE_DIRECTORIES "${_bundle}/include")

# The prebuilt rendezvous library and what it needs at link time: every shared library of the
# bundle (gRPC, Protobuf, Abseil, ...; the linker keeps those it uses).
file(GLOB _shared "${_bundle}/lib/*.so.*")
add_library(cxxlaunch_proto STATIC IMPORTED)
set_target_properties(cxxlaunch_proto PROPERTIES
  IMPORTED_LOCATION "${_bundle}/lib/libcxxlaunch_proto.a"
  INTERFACE_LINK_LIBRARIES "${_shared}")
add_library(cxxlaunch_rendezvous STATIC IMPORTED)
set_target_properties(cxxlaunch_rendezvous PROPERTIES
  IMPORTED_LOCATION "${_bundle}/lib/libcxxlaunch_rendezvous.a"
  INTERFACE_LINK_LIBRARIES "cxxlaunch_proto;cxxlaunch_common;Threads::Threads")
target_include_directories(cxxlaunch_rendezvous INTERFACE ${CXXLAUNCH_INCLUDE_ROOT})

# The binaries, where the tests and scripts look for them. They find their libraries through
# LD_LIBRARY_PATH=<bundle>/lib, which gpu-check.sh sets.
foreach(_program cxxlaunch cxxlaunchd)
  add_executable(${_program} IMPORTED GLOBAL)
  set_target_properties(${_program} PROPERTIES IMPORTED_LOCATION "${CMAKE_BINARY_DIR}/bin/${_program}")
  file(COPY "${_bundle}/bin/${_program}" DESTINATION "${CMAKE_BINARY_DIR}/bin")
endforeach()

# catch_discover_tests (include(Catch)).
list(APPEND CMAKE_MODULE_PATH "${_bundle}/cmake")
