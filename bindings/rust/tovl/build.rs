//! Gives this crate's binaries (tests, examples) the rpath of the libtovl that
//! tovl-sys linked (see tovl-sys/build.rs for how it is chosen), so they run
//! without LD_LIBRARY_PATH. Binaries carried to another machine set
//! LD_LIBRARY_PATH there instead.
fn main() {
    if let Ok(dir) = std::env::var("DEP_TOVL_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
