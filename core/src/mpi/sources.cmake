# MPI, optional (Debian's libopenmpi-dev): TESSERA_MPI=AUTO uses it when found, ON requires it, OFF
# leaves it out. Only the files of this folder call MPI; without it, comm_single.cpp is one rank.
target_sources(tessera PRIVATE ${CMAKE_CURRENT_LIST_DIR}/launcher.cpp)
if(TESSERA_MPI_FOUND)
  target_sources(tessera PRIVATE ${CMAKE_CURRENT_LIST_DIR}/comm_mpi.cpp)
  target_link_libraries(tessera PRIVATE MPI::MPI_C)
else()
  target_sources(tessera PRIVATE ${CMAKE_CURRENT_LIST_DIR}/comm_single.cpp)
endif()
