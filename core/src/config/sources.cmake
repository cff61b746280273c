# The config loader (YAML -> tessera/config.h). yaml_parse.cpp is the only file that uses yaml-cpp.
target_sources(tessera PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/expr.cpp
  ${CMAKE_CURRENT_LIST_DIR}/loader.cpp
  ${CMAKE_CURRENT_LIST_DIR}/node.cpp
  ${CMAKE_CURRENT_LIST_DIR}/schema.cpp
  ${CMAKE_CURRENT_LIST_DIR}/yaml_parse.cpp)
