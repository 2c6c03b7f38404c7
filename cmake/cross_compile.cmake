# Compiles each of SOURCES to an object with the compiler CXX (a cross compiler) against INCLUDES,
# into OUT: a ctest (CMakeLists.txt, KernelsBuildForArm64) that fails with the compiler's first
# errors when a source does not build for that target.
#   cmake -DCXX=aarch64-linux-gnu-g++ "-DSOURCES=a.cpp;b.cpp" "-DINCLUDES=dir1;dir2" -DOUT=dir -P cross_compile.cmake
file(MAKE_DIRECTORY "${OUT}")
set(flags -std=c++17 -O0 -fopenmp -Wall -Wno-unused-parameter)
foreach(dir ${INCLUDES})
  list(APPEND flags "-I${dir}")
endforeach()
set(failed "")
foreach(src ${SOURCES})
  get_filename_component(name "${src}" NAME_WE)
  execute_process(COMMAND "${CXX}" ${flags} -c "${src}" -o "${OUT}/${name}.o"
                  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    string(REGEX MATCHALL "[^\n]*error:[^\n]*" errors "${err}")
    list(GET errors 0 first)
    message("${src}: ${first}")
    list(APPEND failed "${name}")
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "does not build for ${CXX}: ${failed}")
endif()
list(LENGTH SOURCES n)
message("${n} sources build for ${CXX}")
