# The audio plugin's suite: the plugin through the ABI, and its signal path (tessera_audio_dsp)
# directly for decoding and resampling checks. Fixtures: tests/data/audio (see its README).
tessera_add_test(test_plugin_audio test_plugin_audio.cpp)
target_link_libraries(test_plugin_audio PRIVATE tessera_audio_dsp nlohmann_json::nlohmann_json)
add_dependencies(test_plugin_audio tessera_plugin_audio)
