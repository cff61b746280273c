# Hugging Face model folders (config.json, safetensors, tokenizer files) <-> ModelConfig.
target_sources(tessera PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/mapping.cpp
  ${CMAKE_CURRENT_LIST_DIR}/import.cpp
  ${CMAKE_CURRENT_LIST_DIR}/export.cpp)
