# Run by `cmake --install` (cmake/install.cmake): installs CXXLAUNCH_HEADER_ROOTS and every header
# of this repository they include, found by following their #include "..." lines, under
# CXXLAUNCH_HEADER_DESTINATION with the paths they have in the tree (runtime/..., common/...):
# the headers include each other that way. A public header that includes a file the tree does not
# hold (a generated .pb.h) stops the install: the installed headers must compile on their own.
cmake_policy(VERSION 3.25)  # install scripts run under CMake 2.x policies; include() scopes this
set(_todo ${CXXLAUNCH_HEADER_ROOTS})
set(_seen "")
while(_todo)
  list(POP_FRONT _todo _header)
  if(_header IN_LIST _seen)
    continue()
  endif()
  list(APPEND _seen ${_header})
  file(STRINGS "${CXXLAUNCH_HEADER_SOURCE_DIR}/${_header}" _lines
       REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(_line IN LISTS _lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" _included "${_line}")
    if(NOT EXISTS "${CXXLAUNCH_HEADER_SOURCE_DIR}/${_included}")
      message(FATAL_ERROR "cxxlaunch: the public header ${_header} includes \"${_included}\", "
                          "which is not a file of the source tree; public headers may include "
                          "only headers of ours that are installed with them")
    endif()
    list(APPEND _todo ${_included})
  endforeach()
endwhile()
list(SORT _seen)
foreach(_header IN LISTS _seen)
  get_filename_component(_folder "${_header}" DIRECTORY)
  file(INSTALL "${CXXLAUNCH_HEADER_SOURCE_DIR}/${_header}"
       DESTINATION "${CXXLAUNCH_HEADER_DESTINATION}/${_folder}")
endforeach()
