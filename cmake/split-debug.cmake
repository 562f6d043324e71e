# cmake -DOBJCOPY=... -DIN=... -DOUT=... [-DDEBUG=...] -P split-debug.cmake
#
# Writes OUT, a copy of IN without debug information (and, for a shared
# library or program, without the symbols only a debugger needs). With DEBUG,
# the debug information goes to that file and OUT records it in a
# .gnu_debuglink section: gdb finds it in a `.debug` directory beside OUT.
# Without DEBUG (the static library) the debug information is dropped.
get_filename_component(out_dir "${OUT}" DIRECTORY)
file(MAKE_DIRECTORY "${out_dir}")
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()
if(DEBUG)
  get_filename_component(debug_dir "${DEBUG}" DIRECTORY)
  file(MAKE_DIRECTORY "${debug_dir}")
  run("${OBJCOPY}" --only-keep-debug --compress-debug-sections=zlib "${IN}" "${DEBUG}")
  run("${OBJCOPY}" --strip-debug --strip-unneeded "${IN}" "${OUT}.tmp")
  # --add-gnu-debuglink reads DEBUG (for its checksum) and records its name.
  run("${OBJCOPY}" "--add-gnu-debuglink=${DEBUG}" "${OUT}.tmp" "${OUT}")
  file(REMOVE "${OUT}.tmp")
else()
  run("${OBJCOPY}" --strip-debug "${IN}" "${OUT}")
endif()
