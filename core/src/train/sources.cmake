# Training part of libtessera: the training loop, checkpoints (and, merged next, the optimizers).
target_sources(tessera PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp)
