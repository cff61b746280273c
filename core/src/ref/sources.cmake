# The reference loops: every op of ops.h written plainly, the fast path's twin in the tests.
target_sources(tessera PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/ops_ref.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops_ref_backward.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention_ref_backward.cpp)
