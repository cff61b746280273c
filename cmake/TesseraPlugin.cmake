# tessera_add_plugin(NAME SOURCES src... [LINK lib...] [OUTPUT_DIRECTORY dir])
# Builds a modality plugin: a MODULE library libtessera_<NAME>.so with hidden symbols that exports
# exactly one, tessera_plugin_entry (linker version script), and has no undefined symbols. It sees
# only tessera/plugin.h and tessera/plugin.hpp (target tessera::plugin_headers), never libtessera.
# Used by Tessera's own plugins and, through find_package(tessera), by third-party ones.
set(_TESSERA_PLUGIN_MAP "${CMAKE_CURRENT_LIST_DIR}/tessera_plugin.map")

function(tessera_add_plugin name)
  cmake_parse_arguments(P "" "OUTPUT_DIRECTORY" "SOURCES;LINK" ${ARGN})
  if(NOT P_SOURCES)
    message(FATAL_ERROR "tessera_add_plugin(${name}): give its SOURCES")
  endif()
  set(target tessera_plugin_${name})
  add_library(${target} MODULE ${P_SOURCES})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib" OUTPUT_NAME "tessera_${name}"
    C_VISIBILITY_PRESET hidden CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
    CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON C_STANDARD 11 C_STANDARD_REQUIRED ON)
  if(P_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${P_OUTPUT_DIRECTORY}")
  endif()
  target_link_libraries(${target} PRIVATE tessera::plugin_headers ${P_LINK})
  target_link_options(${target} PRIVATE "LINKER:--version-script=${_TESSERA_PLUGIN_MAP}")
  if(NOT TESSERA_SANITIZE)  # sanitizer runtimes resolve at load time, from the host
    target_link_options(${target} PRIVATE "LINKER:--no-undefined")
  endif()
endfunction()
