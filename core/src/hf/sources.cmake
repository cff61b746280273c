# Hugging Face model folders (config.json, safetensors, tokenizer files) <-> ModelConfig.
# import.cpp reads the folder and checks the tensors; family_<name>.cpp reads each family's settings.
target_sources(tessera PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/mapping.cpp
  ${CMAKE_CURRENT_LIST_DIR}/import.cpp
  ${CMAKE_CURRENT_LIST_DIR}/family_bert.cpp
  ${CMAKE_CURRENT_LIST_DIR}/family_gpt2.cpp
  ${CMAKE_CURRENT_LIST_DIR}/family_vit.cpp
  ${CMAKE_CURRENT_LIST_DIR}/family_esm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/family_ast.cpp
  ${CMAKE_CURRENT_LIST_DIR}/export.cpp)
