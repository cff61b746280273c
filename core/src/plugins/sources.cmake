target_sources(tessera PRIVATE ${CMAKE_CURRENT_LIST_DIR}/loader.cpp ${CMAKE_CURRENT_LIST_DIR}/workers.cpp)
target_link_libraries(tessera PRIVATE ${CMAKE_DL_LIBS})
target_compile_definitions(tessera PRIVATE TESSERA_BUILD_DIR="${PROJECT_BINARY_DIR}"
                                           TESSERA_BUILD_PLUGIN_DIR="${PROJECT_BINARY_DIR}/plugins")
