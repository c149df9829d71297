# cmake -DNM=nm -DALLOWED=<regex> -DOBJECTS="a.o|b.o" -P check_tier_symbols.cmake
# (ALLOWED: the namespaces the objects may define symbols in, e.g. "attnops::cpu::tier_avx2::")
#
# A tier object is compiled with its tier's target flags. Any symbol it defines that is global
# or link-once (weak, unique) and is not inside the ALLOWED namespaces could be merged with a
# copy from another object at link time, and the linker keeps one: an AVX-512 copy of, say,
# std::vector<float>::_M_default_append could end up serving baseline code (SIGILL on older
# CPUs). Tier sources avoid that by keeping everything in their namespace (README.md); this
# check fails on any exception, and on static initialisers (they run at load time on every CPU).
string(REPLACE "|" ";" objects "${OBJECTS}")
set(bad "")
foreach(obj ${objects})
  execute_process(COMMAND ${NM} -C --defined-only ${obj} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${obj}")
  endif()
  string(REPLACE "\n" ";" lines "${out}")
  foreach(line ${lines})
    if(line MATCHES "^[0-9a-f]* ([A-Za-z]) (.*)$")
      set(type "${CMAKE_MATCH_1}")
      set(name "${CMAKE_MATCH_2}")
      if(name MATCHES "_GLOBAL__sub_I")
        list(APPEND bad "${obj}: static initialiser ${name}")
      elseif(type MATCHES "^[A-Zuvw]$" AND NOT name MATCHES "${ALLOWED}"
             AND NOT name STREQUAL "DW.ref.__gxx_personality_v0")
        list(APPEND bad "${obj}: ${type} ${name}")
      endif()
    endif()
  endforeach()
endforeach()
if(bad)
  string(REPLACE ";" "\n  " bad "${bad}")
  message(FATAL_ERROR "per-ISA objects define symbols outside ${ALLOWED} (see backends/cpu/README.md):\n  ${bad}")
endif()
list(LENGTH objects n)
message(STATUS "${n} objects: every global and link-once symbol matches ${ALLOWED}")
