# File I/O part of libtessera: plain files (fileio), safetensors, .npy.
target_sources(tessera PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/fileio.cpp
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp
  ${CMAKE_CURRENT_LIST_DIR}/npy.cpp)
