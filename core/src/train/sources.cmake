# Training part of libtessera: checkpoints.
target_sources(tessera PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp)
