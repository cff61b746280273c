# The image plugin's suite: parity with Hugging Face processors on tests/data/image, decoding,
# provenance, bad files and bad options, all through the plugin ABI.
tessera_add_test(test_plugin_image test_plugin_image.cpp)
target_link_libraries(test_plugin_image PRIVATE nlohmann_json::nlohmann_json)
add_dependencies(test_plugin_image tessera_plugin_image)
