# Hand-written kernels for what oneDNN 2.6 lacks on the machines in use (no oneDNN headers here).
target_sources(tessera PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/gemv_bf16.cpp)
