#pragma once
// LOWCOMM_API marks what liblowcomm.so exports. The library is built with hidden visibility, so
// every public function and class of include/lowcomm/ carries it and nothing else is visible.

#if defined(__GNUC__) || defined(__clang__)
#define LOWCOMM_API __attribute__((visibility("default")))
#else
#define LOWCOMM_API
#endif
