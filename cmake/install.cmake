# `cmake --install`: the libraries, the `idemsaga` binary, the public headers and a CMake
# package, so that another project says find_package(idemsaga CONFIG REQUIRED) and links
# idemsaga::app (an orchestrator binary of its own), idemsaga::participant (a participant
# service), idemsaga::saga (definitions only) or idemsaga::testing (the test kit); and a
# pkg-config file, idemsaga.pc. `cpack -G DEB` in the build directory makes a Debian package of
# the same files.
#
# Headers: include/idemsaga/ and nothing else. They include no header of ours outside it, and
# no httplib, Boost or libpq header (tests/install/check_headers.py), so the internals behind
# them can change without a user noticing.
include(CMakePackageConfigHelpers)

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

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/idemsaga
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.hpp")
install(FILES ${PROJECT_SOURCE_DIR}/CHANGELOG.md DESTINATION ${CMAKE_INSTALL_DOCDIR})

configure_file(${PROJECT_SOURCE_DIR}/cmake/idemsaga.pc.in ${PROJECT_BINARY_DIR}/idemsaga.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/idemsaga.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# cpack -G DEB: the same files as a Debian package, depending on Debian's packages of what
# the libraries link.
set(CPACK_PACKAGE_NAME idemsaga)
set(CPACK_PACKAGE_VENDOR idemsaga)
set(CPACK_PACKAGE_CONTACT "idemsaga developers <dev@idemsaga.dev>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Saga orchestrator with idempotency keys end to end")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libpqxx-dev, libcpp-httplib-dev, libssl-dev, nlohmann-json3-dev, libboost-dev, librabbitmq-dev, libhiredis-dev, libcli11-dev, libjemalloc2")
include(CPack)
