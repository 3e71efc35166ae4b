/* volk's implementation, compiled here with its symbols renamed (see the
 * generated tovl_volk_rename.h) and our warnings relaxed for its code only:
 * it converts dlsym's object pointer to a function pointer, which ISO C
 * pedantically forbids and every POSIX system does. */
#include "tovl_volk_rename.h"

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wcast-function-type"
#endif
#include "volk.c"
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
