# Training part of libtessera: the training loop, checkpoints, optimizers, learning-rate schedules
# and gradient helpers (tessera/train.h, checkpoint.h, optim.h). No oneDNN here.
target_sources(tessera PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/trainer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/examples.cpp
  ${CMAKE_CURRENT_LIST_DIR}/baseline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/masking.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/optim.cpp)
# The optimizer's arithmetic as written: no multiply-adds fused behind the code's back (torch's
# rounding, and the same bits with and without FMA instructions); sqrt without errno, so its loops
# vectorise.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/optim.cpp PROPERTIES
  COMPILE_OPTIONS "-ffp-contract=off;-fno-math-errno")
# The run folder's plots (loss.png, metric.png, confusion.png): cairo, libcairo2-dev (which brings
# libfontconfig-dev: the plots give fontconfig's state back when they are done).
target_sources(tessera PRIVATE ${CMAKE_CURRENT_LIST_DIR}/report.cpp)
find_package(PkgConfig REQUIRED)
pkg_check_modules(CAIRO REQUIRED IMPORTED_TARGET cairo fontconfig)
target_link_libraries(tessera PRIVATE PkgConfig::CAIRO)
