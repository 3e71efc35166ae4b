/* LD_PRELOADed into the tests of the "asan" preset (tests/hardening.cmake):
 * dlclose does nothing, so a library that tovl loads at run time (the Vulkan
 * driver through the loader, the HIP runtime) stays resident until exit.
 *
 * Why: drivers keep process-lifetime allocations in their globals. When the
 * library is unloaded those blocks lose their last reference, and LeakSanitizer
 * reports them from "<unknown module>": the frames cannot be symbolized, so no
 * suppression can name the driver, and the report is indistinguishable from a
 * real leak. Kept resident, those blocks stay reachable; any real leak inside
 * a driver would now be symbolized and could be suppressed by library name in
 * scripts/lsan.supp. tovl's own allocations are unaffected. */
int dlclose(void *handle);

int dlclose(void *handle) {
    (void)handle;
    return 0;
}
