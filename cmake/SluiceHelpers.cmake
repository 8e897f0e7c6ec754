# Small helpers in the manner of Arrow's add_arrow_test: one for a library, one for a test.

# sluice_add_library(NAME SOURCES a.cc b.cc DEPS x y)
function(sluice_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
endfunction()

# sluice_add_test(NAME SOURCES a_test.cc DEPS x LABELS unit)
# Registers each gtest case with ctest (gtest_discover_tests) under the given labels.
function(sluice_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  if(SLUICE_DEV_SKIP_MISSING_TESTS)
    # Developer convenience only (never set in presets or CI): ignore tests whose sources do not exist yet.
    foreach(src ${ARG_SOURCES})
      if(NOT EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${src})
        return()
      endif()
    endforeach()
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  include(GoogleTest)
  # gtest_discover_tests flattens list-valued properties, so several labels become one ("unit-runtime");
  # ctest -L takes a regular expression, so `ctest -L runtime` and `ctest -L unit` both select it.
  string(REPLACE ";" "-" labels "${ARG_LABELS}")
  # Integration tests share the services of one run (and load the machine): never in parallel. A test that pauses,
  # bounces or stops a broker uses a private one (tests/integration/test_util/private_kafka.h).
  set(lock "")
  if(labels MATCHES "integration")
    set(lock RESOURCE_LOCK services)
  endif()
  gtest_discover_tests(${name}
    PROPERTIES LABELS "${labels}" TIMEOUT ${ARG_TIMEOUT} ${lock}
    DISCOVERY_TIMEOUT 60)
endfunction()
