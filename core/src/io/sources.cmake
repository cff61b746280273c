# File I/O part of libtessera: plain files (fileio), safetensors, .npy and SHA-256 checksums.
target_sources(tessera PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/fileio.cpp
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp
  ${CMAKE_CURRENT_LIST_DIR}/npy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sha256.cpp)
