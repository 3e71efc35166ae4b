//! Gives this crate's binaries (tests, examples) the rpath of the libtovl that
//! tovl-sys linked (see tovl-sys/build.rs for how it is chosen), so they run
//! without LD_LIBRARY_PATH; binaries carried to another machine set
//! LD_LIBRARY_PATH there instead. The tests also learn that directory
//! (TOVL_LINKED_LIBDIR) to find the `tovl` CLI beside it.
fn main() {
    let dir = std::env::var("DEP_TOVL_LIBDIR").unwrap_or_default();
    if !dir.is_empty() {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    println!("cargo:rustc-env=TOVL_LINKED_LIBDIR={dir}");
}
