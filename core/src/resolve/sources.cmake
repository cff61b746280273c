# Resolving an experiment against the machine it runs on: whether the model's memory plan fits.
target_sources(tessera PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/machine.cpp)
