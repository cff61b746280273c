# The oneDNN fast path: the only files of Tessera that include oneDNN headers.
target_sources(tessera PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/engine.cpp
  ${CMAKE_CURRENT_LIST_DIR}/linear.cpp
  ${CMAKE_CURRENT_LIST_DIR}/matmul.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/softmax_norm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/elementwise.cpp
  ${CMAKE_CURRENT_LIST_DIR}/heads.cpp
  ${CMAKE_CURRENT_LIST_DIR}/backward.cpp)
# glibc's vector math (libmvec): the fused attention's exponentials.
target_link_libraries(tessera PRIVATE mvec)
