# The names another project links, the same whether it finds an installed idemsaga
# (find_package: cmake/install.cmake exports them) or builds it as a part of itself
# (add_subdirectory, FetchContent: the aliases): idemsaga::app (an orchestrator binary of its
# own), idemsaga::participant (a participant service), idemsaga::saga (definitions only),
# idemsaga::testing (the test kit), and the libraries behind them.
set(IDEMSAGA_EXPORTED idemsaga_common idemsaga_saga idemsaga_guard idemsaga_steps
    idemsaga_orchestrator idemsaga_common_amqp idemsaga_guard_amqp idemsaga_amqp idemsaga_participant idemsaga_app)
if(TARGET idemsaga_testing)
  list(APPEND IDEMSAGA_EXPORTED idemsaga_testing)
endif()
foreach(target IN LISTS IDEMSAGA_EXPORTED)
  string(REPLACE "idemsaga_" "" name ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  add_library(idemsaga::${name} ALIAS ${target})
endforeach()

# The headers need C++20 wherever they are compiled.
target_compile_features(idemsaga_common PUBLIC cxx_std_20)
