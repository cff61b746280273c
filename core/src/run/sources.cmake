target_sources(tessera PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/dataset.cpp
  ${CMAKE_CURRENT_LIST_DIR}/heatmap.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sequences.cpp
  ${CMAKE_CURRENT_LIST_DIR}/batcher.cpp
  ${CMAKE_CURRENT_LIST_DIR}/batch_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/writers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/run_folder.cpp
  ${CMAKE_CURRENT_LIST_DIR}/preview.cpp
  ${CMAKE_CURRENT_LIST_DIR}/runner.cpp
  ${CMAKE_CURRENT_LIST_DIR}/generation.cpp)
find_package(PNG REQUIRED)  # libpng-dev: attention heatmaps
target_link_libraries(tessera PRIVATE PNG::PNG)
