# Seeded random numbers and weight initialisation (core/include/tessera/random.h).
target_sources(tessera PRIVATE ${CMAKE_CURRENT_LIST_DIR}/random.cpp ${CMAKE_CURRENT_LIST_DIR}/dropout.cpp)
# Bit-for-bit agreement with NumPy needs every a * b + c rounded twice, as NumPy's C does:
# no fused multiply-adds, whatever -march says.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/random.cpp PROPERTIES COMPILE_OPTIONS -ffp-contract=off)
