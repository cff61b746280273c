# The resolve layer, above the config layer: an experiment resolved against the world it names
# (plugins, Hugging Face folders: world.cpp, which holds load_experiment) and the machine it runs
# on (whether the model's memory plan fits: machine.cpp).
target_sources(tessera PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/machine.cpp
  ${CMAKE_CURRENT_LIST_DIR}/world.cpp)
