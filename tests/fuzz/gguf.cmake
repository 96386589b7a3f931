# libFuzzer target of the GGUF header parser and the dequantizers (fuzz-gguf.c). Included by
# tests/fuzz/CMakeLists.txt after its clang probe: like fuzz-wire, it reports SKIP (exit 77)
# with the reason when clang cannot build it.
#
#   ctest -R fuzz-gguf       15 s of fuzzing from the seed written here (a small valid file:
#                            string and integer arrays, an F32 and a Q4_K tensor)
if(fuzz_why)
  add_test(NAME fuzz-gguf COMMAND sh -c "echo \"fuzz-gguf skipped: $1\"; exit 77" sh
                                       "${fuzz_why}")
  set_tests_properties(fuzz-gguf PROPERTIES SKIP_RETURN_CODE 77 LABELS fuzz)
  return()
endif()

set(GGUFFUZZ_BIN ${CMAKE_CURRENT_BINARY_DIR}/fuzz-gguf)
set(GGUFFUZZ_SEEDS ${CMAKE_CURRENT_BINARY_DIR}/gguf-corpus)
set(GGUFFUZZ_WORK ${CMAKE_CURRENT_BINARY_DIR}/gguf-corpus-work)
set(GGUFFUZZ_SOURCES
  ${PROJECT_SOURCE_DIR}/model/gguf.c
  ${PROJECT_SOURCE_DIR}/model/gguf-quant.c
  ${PROJECT_SOURCE_DIR}/kernels/weight-blocks.c
  ${PROJECT_SOURCE_DIR}/common/dtype.c)
file(MAKE_DIRECTORY ${GGUFFUZZ_WORK} ${GGUFFUZZ_SEEDS})

# The seed is binary: printf's octal escapes write it (560 bytes, made by a few lines of
# Python with struct.pack; the layout is described in model/gguf.h).
add_custom_command(OUTPUT ${GGUFFUZZ_SEEDS}/small.gguf
  COMMAND sh -c "printf '\\107\\107\\125\\106\\003\\000\\000\\000\\002\\000\\000\\000\\000\\000\\000\\000\\003\\000\\000\\000\\000\\000\\000\\000\\024\\000\\000\\000\\000\\000\\000\\000\\147\\145\\156\\145\\162\\141\\154\\056\\141\\162\\143\\150\\151\\164\\145\\143\\164\\165\\162\\145\\010\\000\\000\\000\\005\\000\\000\\000\\000\\000\\000\\000\\154\\154\\141\\155\\141\\025\\000\\000\\000\\000\\000\\000\\000\\164\\157\\153\\145\\156\\151\\172\\145\\162\\056\\147\\147\\155\\154\\056\\164\\157\\153\\145\\156\\163\\011\\000\\000\\000\\010\\000\\000\\000\\002\\000\\000\\000\\000\\000\\000\\000\\001\\000\\000\\000\\000\\000\\000\\000\\141\\003\\000\\000\\000\\000\\000\\000\\000\\074\\163\\076\\031\\000\\000\\000\\000\\000\\000\\000\\164\\157\\153\\145\\156\\151\\172\\145\\162\\056\\147\\147\\155\\154\\056\\164\\157\\153\\145\\156\\137\\164\\171\\160\\145\\011\\000\\000\\000\\005\\000\\000\\000\\002\\000\\000\\000\\000\\000\\000\\000\\001\\000\\000\\000\\003\\000\\000\\000\\001\\000\\000\\000\\000\\000\\000\\000\\167\\001\\000\\000\\000\\040\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\001\\000\\000\\000\\000\\000\\000\\000\\153\\002\\000\\000\\000\\000\\001\\000\\000\\000\\000\\000\\000\\001\\000\\000\\000\\000\\000\\000\\000\\014\\000\\000\\000\\200\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\077\\000\\000\\200\\077\\000\\000\\300\\077\\000\\000\\000\\100\\000\\000\\040\\100\\000\\000\\100\\100\\000\\000\\140\\100\\000\\000\\200\\100\\000\\000\\220\\100\\000\\000\\240\\100\\000\\000\\260\\100\\000\\000\\300\\100\\000\\000\\320\\100\\000\\000\\340\\100\\000\\000\\360\\100\\000\\000\\000\\101\\000\\000\\010\\101\\000\\000\\020\\101\\000\\000\\030\\101\\000\\000\\040\\101\\000\\000\\050\\101\\000\\000\\060\\101\\000\\000\\070\\101\\000\\000\\100\\101\\000\\000\\110\\101\\000\\000\\120\\101\\000\\000\\130\\101\\000\\000\\140\\101\\000\\000\\150\\101\\000\\000\\160\\101\\000\\000\\170\\101\\000\\074\\000\\070\\000\\045\\112\\157\\224\\271\\336\\003\\050\\115\\162\\227\\274\\341\\006\\053\\120\\165\\232\\277\\344\\011\\056\\123\\170\\235\\302\\347\\014\\061\\126\\173\\240\\305\\352\\017\\064\\131\\176\\243\\310\\355\\022\\067\\134\\201\\246\\313\\360\\025\\072\\137\\204\\251\\316\\363\\030\\075\\142\\207\\254\\321\\366\\033\\100\\145\\212\\257\\324\\371\\036\\103\\150\\215\\262\\327\\374\\041\\106\\153\\220\\265\\332\\377\\044\\111\\156\\223\\270\\335\\002\\047\\114\\161\\226\\273\\340\\005\\052\\117\\164\\231\\276\\343\\010\\055\\122\\167\\234\\301\\346\\013\\060\\125\\172\\237\\304\\351\\016\\063\\130\\175\\242\\307\\354\\021\\066\\133\\200\\245\\312\\357\\024\\071\\136\\203\\250\\315\\362\\027' > ${GGUFFUZZ_SEEDS}/small.gguf"
  VERBATIM)
add_custom_command(OUTPUT ${GGUFFUZZ_BIN}
  COMMAND ${GANG_FUZZ_CLANG} ${FUZZ_CFLAGS} ${FUZZ_SANITIZE} -I${PROJECT_SOURCE_DIR}/model
          ${CMAKE_CURRENT_SOURCE_DIR}/fuzz-gguf.c ${GGUFFUZZ_SOURCES} -lm -o ${GGUFFUZZ_BIN}
  DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz-gguf.c ${GGUFFUZZ_SOURCES}
          ${PROJECT_SOURCE_DIR}/model/gguf.h
  COMMENT "Building libFuzzer target fuzz-gguf with clang"
  VERBATIM)
add_custom_target(build-fuzz-gguf ALL DEPENDS ${GGUFFUZZ_BIN} ${GGUFFUZZ_SEEDS}/small.gguf)

add_test(NAME fuzz-gguf
  COMMAND ${GGUFFUZZ_BIN} -max_total_time=15 -rss_limit_mb=2048 -max_len=65536 -timeout=10
          -artifact_prefix=${CMAKE_CURRENT_BINARY_DIR}/gguf- ${GGUFFUZZ_WORK} ${GGUFFUZZ_SEEDS})
set_tests_properties(fuzz-gguf PROPERTIES TIMEOUT 120 LABELS fuzz)
