# File I/O part of libtessera: plain files (fileio), bounded JSON (json_file), safetensors, .npy and IDX.
target_sources(tessera PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/fileio.cpp
  ${CMAKE_CURRENT_LIST_DIR}/json_file.cpp
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp
  ${CMAKE_CURRENT_LIST_DIR}/npy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/idx.cpp)
find_package(ZLIB REQUIRED)  # zlib1g-dev: gzip'd IDX files
target_link_libraries(tessera PRIVATE ZLIB::ZLIB)
