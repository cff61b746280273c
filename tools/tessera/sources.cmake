add_executable(tessera_cli
  ${CMAKE_CURRENT_LIST_DIR}/main.cpp
  ${CMAKE_CURRENT_LIST_DIR}/common.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_check.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_explain.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_forward.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_bench.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench_machine.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_bench_plugins.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_bench_attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_export.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_run.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_search.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_drift.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_generate.cpp)
set_target_properties(tessera_cli PROPERTIES OUTPUT_NAME tessera RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})
target_compile_definitions(tessera_cli PRIVATE TESSERA_VERSION="${PROJECT_VERSION}" TESSERA_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_link_libraries(tessera_cli PRIVATE tessera tessera_build_flags CLI11::CLI11 nlohmann_json::nlohmann_json
                      OpenMP::OpenMP_CXX)  # bench_machine.cpp's FMA and bandwidth loops
