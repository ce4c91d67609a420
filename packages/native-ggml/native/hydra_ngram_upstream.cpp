// The pinned common/ n-gram drafters that native/hydra_ngram.cpp drives, compiled into the addon as
// they are (this file is picked up by the native/*.cpp glob, so CMakeLists needs no list of them).
#include "ngram-cache.cpp"
#include "ngram-map.cpp"
#include "ngram-mod.cpp"
