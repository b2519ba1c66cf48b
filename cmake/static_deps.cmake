# gRPC, Protobuf and yaml-cpp for our targets: `cxxlaunch_grpc` and `cxxlaunch_yaml`, which our
# libraries link instead of naming the packages' targets.
#
# Linked against Debian's shared libraries, `cxxlaunch` loads 58 of them at every start, and
# resolving their symbols took 7 of the 8 ms of CPU that `cxxlaunch --version` cost (perf: ld.so's
# do_lookup_x). An executable that sets the target property CXXLAUNCH_STATIC_DEPS gets the static
# archives of the same packages instead (and a static libstdc++): it loads libc only. Every
# other target (the tests, the runtime and everything that links LibTorch, whose own libprotobuf
# is the shared one) links the shared libraries, so no process holds two copies of Protobuf.
#
# CXXLAUNCH_STATIC_DEPS=OFF (the sanitizer presets) or missing archives: shared everywhere.
option(CXXLAUNCH_STATIC_DEPS "Link cxxlaunch against static gRPC, Protobuf and yaml-cpp" ON)

# protobuf-lite: proto/rendezvous.proto is LITE_RUNTIME; the full runtime's descriptors and
# reflection would be paged in for nothing.
set(_static_names grpc++ grpc upb gpr address_sorting re2 cares ssl crypto z protobuf-lite)
if(CXXLAUNCH_STATIC_DEPS)
  # gRPC's pkg-config file names the Abseil libraries this gRPC was built with.
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    execute_process(COMMAND ${PKG_CONFIG_EXECUTABLE} --static --libs-only-l grpc++
                    OUTPUT_VARIABLE _grpc_static_libs OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE _grpc_pc_result)
    if(_grpc_pc_result EQUAL 0)
      string(REGEX MATCHALL "-labsl_[a-z0-9_]+" _absl "${_grpc_static_libs}")
      foreach(_flag IN LISTS _absl)
        string(SUBSTRING "${_flag}" 2 -1 _name)
        list(APPEND _static_names ${_name})
      endforeach()
    endif()
  endif()
  list(REMOVE_DUPLICATES _static_names)
  set(_static_archives "")
  set(_missing "")
  foreach(_name IN LISTS _static_names ITEMS yaml-cpp)
    find_library(CXXLAUNCH_STATIC_${_name} NAMES lib${_name}.a)
    mark_as_advanced(CXXLAUNCH_STATIC_${_name})
    if(CXXLAUNCH_STATIC_${_name})
      list(APPEND _static_archives ${CXXLAUNCH_STATIC_${_name}})
    else()
      list(APPEND _missing lib${_name}.a)
    endif()
  endforeach()
  if(_missing OR NOT _absl)
    message(STATUS "cxxlaunch links shared gRPC (no static archives: ${_missing})")
    set(CXXLAUNCH_STATIC_DEPS OFF)
  endif()
endif()

# The static set: one link group (the archives need each other both ways), then what they need
# from the system.
if(CXXLAUNCH_STATIC_DEPS)
  list(REMOVE_ITEM _static_archives ${CXXLAUNCH_STATIC_yaml-cpp})
  add_library(cxxlaunch_grpc_static INTERFACE)
  target_link_libraries(cxxlaunch_grpc_static INTERFACE
    "$<LINK_GROUP:RESCAN,${_static_archives}>" Threads::Threads ${CMAKE_DL_LIBS} rt m)
  target_include_directories(cxxlaunch_grpc_static SYSTEM INTERFACE
    $<TARGET_PROPERTY:gRPC::grpc++,INTERFACE_INCLUDE_DIRECTORIES>)
  set(_static_grpc cxxlaunch_grpc_static)
  set(_static_yaml ${CXXLAUNCH_STATIC_yaml-cpp})
else()
  set(_static_grpc gRPC::grpc++ protobuf::libprotobuf)
  set(_static_yaml yaml-cpp)
endif()

# Evaluated for the target being linked (the head target): static where it asks for it.
set(_wants_static "$<BOOL:$<TARGET_PROPERTY:CXXLAUNCH_STATIC_DEPS>>")
add_library(cxxlaunch_grpc INTERFACE)
target_link_libraries(cxxlaunch_grpc INTERFACE
  "$<IF:${_wants_static},${_static_grpc},gRPC::grpc++;protobuf::libprotobuf>")
add_library(cxxlaunch_yaml INTERFACE)
target_link_libraries(cxxlaunch_yaml INTERFACE "$<IF:${_wants_static},${_static_yaml},yaml-cpp>")
target_include_directories(cxxlaunch_yaml SYSTEM INTERFACE
  $<TARGET_PROPERTY:yaml-cpp,INTERFACE_INCLUDE_DIRECTORIES>)

# Not position-independent by default: a PIE's start-up relocates its 470 KiB of .data.rel.ro
# and, its text placed differently, faults in more of it; linked at a fixed address the same
# launch peaks 1.5 MiB lower (8.5 against 10.0 MiB, docs/benchmarks.md). The cost is ASLR for
# the binary's own code (libc, the heap and the stacks stay randomised); the server it embeds
# listens on loopback with a job token unless told otherwise. CXXLAUNCH_LAUNCHER_PIE=ON keeps
# PIE, with its relative relocations packed (DT_RELR, glibc 2.36: 1 MiB of .rela.dyn becomes
# 8 KiB).
option(CXXLAUNCH_LAUNCHER_PIE "Link cxxlaunch as a position-independent executable" OFF)
include(CheckLinkerFlag)
check_linker_flag(CXX "-Wl,-z,pack-relative-relocs" CXXLAUNCH_HAVE_RELR)

# glibc linked in too (`-static`): no dynamic loader at start, no libc.so or libm.so to map and
# relocate. On the 2-core VM a launch took 1.5 to 2 ms less in bench/launcher_startup.py and
# peaked 1.8 MiB lower (bench/results/launcher-startup.md). The linker
# warns that getaddrinfo and dlopen need the build's glibc at run time: since glibc 2.34 the
# `files` and `dns` sources of nsswitch.conf are built into libc itself, so host names resolve
# from /etc/hosts and DNS with nothing loaded; only another source named for hosts (mdns,
# myhostname) would be dlopen'ed, and needs the same glibc as the build. Without static glibc
# archives (libc.a) cxxlaunch loads libc as before; CXXLAUNCH_STATIC_LIBC=OFF asks for that.
option(CXXLAUNCH_STATIC_LIBC "Link cxxlaunch with glibc too (fully static)" ON)
if(CXXLAUNCH_STATIC_DEPS AND CXXLAUNCH_STATIC_LIBC AND NOT CXXLAUNCH_LAUNCHER_PIE)
  check_linker_flag(CXX "-static" CXXLAUNCH_HAVE_STATIC_LIBC)
endif()

# cxxlaunch_static_executable(TARGET): links TARGET against the static set (when there is one).
function(cxxlaunch_static_executable target)
  if(CXXLAUNCH_STATIC_DEPS)
    set_target_properties(${target} PROPERTIES CXXLAUNCH_STATIC_DEPS ON)
    if(CXXLAUNCH_HAVE_STATIC_LIBC)
      target_link_options(${target} PRIVATE -static)  # not a PIE (CXXLAUNCH_HAVE_STATIC_LIBC)
      return()
    endif()
    target_link_options(${target} PRIVATE -static-libstdc++ -static-libgcc)
    if(NOT CXXLAUNCH_LAUNCHER_PIE)
      target_link_options(${target} PRIVATE -no-pie)
    elseif(CXXLAUNCH_HAVE_RELR)
      target_link_options(${target} PRIVATE -Wl,-z,pack-relative-relocs)
    endif()
  endif()
endfunction()
