//! `HIPK_ALLOC_CONF` is read when an allocator is created. Its own test binary, so setting
//! the variable cannot race other tests.

use hip_rt::caching::{AllocError, CachingAllocator, ConfigError, HostBackend, CONFIG_ENV, MIB};

#[test]
fn config_from_environment_at_first_use() {
    std::env::set_var(
        CONFIG_ENV,
        "max_split_size_mb:64, garbage_collection_threshold:0.9",
    );
    let alloc = CachingAllocator::new(HostBackend::new(MIB)).unwrap();
    let config = alloc.config();
    assert_eq!(config.max_split_size, 64 * MIB);
    assert_eq!(config.garbage_collection_threshold, 0.9);

    std::env::set_var(CONFIG_ENV, "max_split_size_mb:64,bogus_key:3");
    let err = CachingAllocator::new(HostBackend::new(MIB)).unwrap_err();
    match &err {
        AllocError::Config(ConfigError::UnknownKey { key }) => assert_eq!(key, "bogus_key"),
        other => panic!("expected UnknownKey, got {other}"),
    }
    assert!(err.to_string().contains("bogus_key"));

    std::env::remove_var(CONFIG_ENV);
    let alloc = CachingAllocator::new(HostBackend::new(MIB)).unwrap();
    assert_eq!(alloc.config().max_split_size, usize::MAX);
}
