# `cmake --install`: the libraries, the `idemsaga` binary, the public headers and a CMake
# package, so that another project says find_package(idemsaga CONFIG REQUIRED) and links
# idemsaga::saga, idemsaga::guard or idemsaga::orchestrator (and idemsaga::testing in its
# tests).
#
# Headers: include/idemsaga/{saga,guard,orchestrator,testing}.hpp are the public entry points.
# What they include, and nothing else, is installed under include/idemsaga/ with its includes
# rewritten to "idemsaga/..." (cmake/install_headers.cmake), so the one include directory a
# user gets is <prefix>/include and no name of ours ("common/...") can shadow one of theirs.
include(CMakePackageConfigHelpers)

set(IDEMSAGA_EXPORTED idemsaga_common idemsaga_saga idemsaga_guard idemsaga_steps
    idemsaga_orchestrator idemsaga_testing)
set_target_properties(idemsaga_common PROPERTIES EXPORT_NAME common)
set_target_properties(idemsaga_saga PROPERTIES EXPORT_NAME saga)
set_target_properties(idemsaga_guard PROPERTIES EXPORT_NAME guard)
set_target_properties(idemsaga_steps PROPERTIES EXPORT_NAME steps)
set_target_properties(idemsaga_orchestrator PROPERTIES EXPORT_NAME orchestrator)
set_target_properties(idemsaga_testing PROPERTIES EXPORT_NAME testing)

# The headers need C++20 wherever they are compiled.
target_compile_features(idemsaga_common PUBLIC cxx_std_20)

install(TARGETS ${IDEMSAGA_EXPORTED} EXPORT idemsagaTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS idemsaga RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT idemsagaTargets NAMESPACE idemsaga::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/idemsaga)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/idemsagaConfig.cmake.in
  ${PROJECT_BINARY_DIR}/idemsagaConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/idemsaga)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/idemsagaConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/idemsagaConfig.cmake
              ${PROJECT_BINARY_DIR}/idemsagaConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/idemsaga)

install(CODE "
  set(IDEMSAGA_SOURCE_DIR \"${PROJECT_SOURCE_DIR}\")
  set(IDEMSAGA_INCLUDE_DEST \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_INCLUDEDIR}\")
  include(\"${PROJECT_SOURCE_DIR}/cmake/install_headers.cmake\")
")
