# The text plugin's suite: parity with Hugging Face tokenizers on tests/data/text, through the real
# plugin ABI. It also compiles the plugin's Unicode files in, to check them on every code point.
tessera_add_test(test_plugin_text test_plugin_text.cpp
  ${PROJECT_SOURCE_DIR}/plugins/text/unicode.cpp ${PROJECT_SOURCE_DIR}/plugins/text/pretokenize.cpp)
target_include_directories(test_plugin_text PRIVATE ${PROJECT_SOURCE_DIR}/plugins/text)
target_link_libraries(test_plugin_text PRIVATE nlohmann_json::nlohmann_json)
add_dependencies(test_plugin_text tessera_plugin_text)
