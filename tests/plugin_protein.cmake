# The protein plugin's suite: parity with transformers' EsmTokenizer on real UniProt records, rows,
# length policies and every bad input, all through the real plugin ABI (tests/data/protein).
tessera_add_test(test_plugin_protein test_plugin_protein.cpp)
target_link_libraries(test_plugin_protein PRIVATE nlohmann_json::nlohmann_json)
add_dependencies(test_plugin_protein tessera_plugin_protein)
