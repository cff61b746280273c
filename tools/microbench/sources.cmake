# Developer measurements behind docs/PERFORMANCE.md; built with the tree, never installed.
add_executable(bench_linear ${CMAKE_CURRENT_LIST_DIR}/bench_linear.cpp)
set_target_properties(bench_linear PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})
target_include_directories(bench_linear PRIVATE ${PROJECT_SOURCE_DIR}/core/src)
target_link_libraries(bench_linear PRIVATE tessera tessera_build_flags OpenMP::OpenMP_CXX)

add_executable(bench_allreduce ${CMAKE_CURRENT_LIST_DIR}/bench_allreduce.cpp)
set_target_properties(bench_allreduce PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})
target_link_libraries(bench_allreduce PRIVATE tessera tessera_build_flags)
