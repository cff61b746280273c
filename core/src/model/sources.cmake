target_sources(tessera PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/arena.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/positions.cpp
  ${CMAKE_CURRENT_LIST_DIR}/weights.cpp
  ${CMAKE_CURRENT_LIST_DIR}/parameters.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stem.cpp
  ${CMAKE_CURRENT_LIST_DIR}/block.cpp
  ${CMAKE_CURRENT_LIST_DIR}/head.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/grad.cpp
  ${CMAKE_CURRENT_LIST_DIR}/generate.cpp
  ${CMAKE_CURRENT_LIST_DIR}/finite.cpp)
