//! Every fenced-write adapter (`leasehold::fence::*`) passes the same cases, unchanged,
//! against its real store: PostgreSQL, SQLite, MariaDB, Redis, etcd, S3 (moto's
//! server), and an HTTP service fenced by the tower layer. The servers are the
//! private instances of `scripts/stores.sh` (instance 0, shared by the tests and
//! started if it is not running); the restart case starts, restarts and stops an
//! instance of its own (instance 1), so that it disturbs no other test.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use leasehold::fence::{FenceError, FencedStore, Mode, Outcome, Record, MAX_STORED_TOKEN};
use leasehold::FencingToken;

const ONCE: Mode = Mode::OncePerGrant;
const MANY: Mode = Mode::ManyPerGrant;

fn token(value: u64) -> FencingToken {
    FencingToken::new(value)
}

/// `scripts/stores.sh COMMAND NAME INSTANCE`, which must succeed; its output.
fn stores(command: &str, name: &str, instance: u8) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/stores.sh");
    let output = Command::new("bash")
        .arg(&script)
        .args([command, name, &instance.to_string()])
        .output()
        .unwrap_or_else(|error| panic!("run {}: {error}", script.display()));
    assert!(
        output.status.success(),
        "scripts/stores.sh {command} {name} {instance} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().lines().last().unwrap_or_default().to_string()
}

/// The URL of a running instance, started if needed.
fn store_url(name: &str, instance: u8) -> String {
    stores("start", name, instance);
    stores("url", name, instance)
}

/// A resource of this test's own: the stores outlive runs and are shared by tests.
fn resource(case: &str) -> String {
    format!("conformance/{}/{case}", rand::random::<u64>())
}

async fn read(store: &impl FencedStore, resource: &str) -> Option<Record> {
    store.read(resource).await.expect("read")
}

fn superseded(seen: u64, ours: u64) -> Outcome {
    Outcome::Superseded { seen: token(seen), ours: token(ours) }
}

/// How the cases open a store: a fresh client (its own connection) each call.
trait Opener: Send + Sync + Sized + 'static {
    type Store: FencedStore + 'static;
    fn open(&self) -> impl Future<Output = Self::Store> + Send;
    /// The same store reached through `proxy` (its URL with the proxy's address), or
    /// None for a store without a connection (SQLite).
    fn proxied(&self, proxy: SocketAddr) -> Option<Self>;
}

/// `scheme://[user@]host:port/rest` with another `host:port`.
fn through(url: &str, proxy: SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let user = authority.rsplit_once('@').map(|(user, _)| format!("{user}@")).unwrap_or_default();
    format!("{scheme}://{user}{proxy}{path}")
}

/// A TCP proxy of one upstream that loses one answer: after a request carrying
/// `marker` (the written value) went through to the store, it drops the store's next
/// answer and closes the connection. The store applied the write; the client never
/// hears of it.
struct LosingProxy {
    address: SocketAddr,
}

impl LosingProxy {
    async fn start(upstream: SocketAddr, marker: &'static [u8]) -> LosingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else { continue };
                let swallow = Arc::new(AtomicBool::new(false));
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let requests = tokio::spawn({
                    let swallow = swallow.clone();
                    async move {
                        let mut buffer = vec![0u8; 64 * 1024];
                        while let Ok(read @ 1..) = client_read.read(&mut buffer).await {
                            if buffer[..read].windows(marker.len()).any(|window| window == marker) {
                                swallow.store(true, Ordering::SeqCst);
                            }
                            if server_write.write_all(&buffer[..read]).await.is_err() {
                                break;
                            }
                        }
                    }
                });
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 64 * 1024];
                    while let Ok(read @ 1..) = server_read.read(&mut buffer).await {
                        if swallow.load(Ordering::SeqCst) {
                            break; // the answer is dropped with the connection
                        }
                        if client_write.write_all(&buffer[..read]).await.is_err() {
                            break;
                        }
                    }
                    requests.abort();
                });
            }
        });
        LosingProxy { address }
    }
}

async fn first_write_creates(opener: &impl Opener) {
    let store = opener.open().await;
    let name = resource("first");
    assert_eq!(read(&store, &name).await, None);
    assert_eq!(store.write(&name, token(7), ONCE, b"seven").await.unwrap(), Outcome::Accepted);
    assert_eq!(read(&store, &name).await, Some(Record { token: token(7), value: Some(b"seven".to_vec()) }));
}

async fn an_older_token_is_refused_and_changes_nothing(opener: &impl Opener) {
    let store = opener.open().await;
    let name = resource("older");
    assert!(store.write(&name, token(20), ONCE, b"new").await.unwrap().is_accepted());
    for mode in [ONCE, MANY] {
        assert_eq!(store.write(&name, token(19), mode, b"stale").await.unwrap(), superseded(20, 19));
        assert_eq!(store.advance(&name, token(3), mode).await.unwrap(), superseded(20, 3));
    }
    assert_eq!(read(&store, &name).await, Some(Record { token: token(20), value: Some(b"new".to_vec()) }));
}

async fn the_same_token_once_and_many(opener: &impl Opener) {
    let store = opener.open().await;
    let name = resource("same");
    assert!(store.write(&name, token(5), ONCE, b"first").await.unwrap().is_accepted());
    let again = store.write(&name, token(5), ONCE, b"second").await.unwrap();
    assert_eq!(again, superseded(5, 5));
    assert!(again.is_ours(), "a refusal by our own token says our earlier write landed");
    assert_eq!(read(&store, &name).await.unwrap().value, Some(b"first".to_vec()));
    assert!(store.write(&name, token(5), MANY, b"second").await.unwrap().is_accepted());
    assert!(store.write(&name, token(5), MANY, b"third").await.unwrap().is_accepted());
    assert_eq!(read(&store, &name).await, Some(Record { token: token(5), value: Some(b"third".to_vec()) }));
    // The next grant's first write shuts the old grant out in both modes.
    assert!(store.write(&name, token(6), ONCE, b"next").await.unwrap().is_accepted());
    assert_eq!(store.write(&name, token(5), MANY, b"late").await.unwrap(), superseded(6, 5));
}

async fn advance_moves_the_fence_and_keeps_the_value(opener: &impl Opener) {
    let store = opener.open().await;
    let name = resource("advance");
    assert!(store.advance(&name, token(3), ONCE).await.unwrap().is_accepted());
    assert_eq!(read(&store, &name).await, Some(Record { token: token(3), value: None }));
    assert!(store.write(&name, token(4), ONCE, b"four").await.unwrap().is_accepted());
    assert!(store.advance(&name, token(9), ONCE).await.unwrap().is_accepted());
    assert_eq!(read(&store, &name).await, Some(Record { token: token(9), value: Some(b"four".to_vec()) }));
    assert_eq!(store.write(&name, token(8), MANY, b"eight").await.unwrap(), superseded(9, 8));
    // Many per grant: the grant that advanced may write; once per grant it may not.
    assert!(store.write(&name, token(9), MANY, b"nine").await.unwrap().is_accepted());
    assert_eq!(store.advance(&name, token(9), ONCE).await.unwrap(), superseded(9, 9));
}

/// Writers with t1 < t2, in both orders and racing on two connections: only t2's value
/// remains, and t1 is refused whenever it came second.
async fn racing_writers_leave_only_the_newer_write(opener: &impl Opener) {
    let (one, two) = (opener.open().await, opener.open().await);
    for mode in [ONCE, MANY] {
        let name = resource("order-old-first");
        assert!(one.write(&name, token(10), mode, b"t1").await.unwrap().is_accepted());
        assert!(two.write(&name, token(11), mode, b"t2").await.unwrap().is_accepted());
        assert_eq!(read(&one, &name).await.unwrap().value, Some(b"t2".to_vec()));

        let name = resource("order-new-first");
        assert!(two.write(&name, token(11), mode, b"t2").await.unwrap().is_accepted());
        assert_eq!(one.write(&name, token(10), mode, b"t1").await.unwrap(), superseded(11, 10));
        assert_eq!(read(&one, &name).await.unwrap().value, Some(b"t2".to_vec()));
    }
    let (one, two) = (Arc::new(one), Arc::new(two));
    for round in 0..20u64 {
        let name = Arc::new(resource(&format!("race-{round}")));
        let (t1, t2) = (100 + 2 * round, 101 + 2 * round);
        let old = tokio::spawn({
            let (store, name) = (one.clone(), name.clone());
            async move { store.write(&name, token(t1), ONCE, b"t1").await.unwrap() }
        });
        let new = tokio::spawn({
            let (store, name) = (two.clone(), name.clone());
            async move { store.write(&name, token(t2), ONCE, b"t2").await.unwrap() }
        });
        let (old, new) = (old.await.unwrap(), new.await.unwrap());
        assert!(new.is_accepted(), "round {round}: the newer token is refused: {new:?}");
        assert!(matches!(old, Outcome::Accepted) || old == superseded(t2, t1), "round {round}: {old:?}");
        assert_eq!(read(&*one, &name).await, Some(Record { token: token(t2), value: Some(b"t2".to_vec()) }));
    }
}

async fn tokens_span_the_whole_signed_range(opener: &impl Opener) {
    let store = opener.open().await;
    let name = resource("range");
    // 2^53 + 1 and 2^53 are one double apart: a float comparison takes them for equal.
    assert!(store.write(&name, token((1 << 53) + 1), ONCE, b"high").await.unwrap().is_accepted());
    assert_eq!(store.write(&name, token(1 << 53), MANY, b"low").await.unwrap(), superseded((1 << 53) + 1, 1 << 53));
    assert!(store.write(&name, token(MAX_STORED_TOKEN - 1), ONCE, b"max-1").await.unwrap().is_accepted());
    assert!(store.write(&name, token(MAX_STORED_TOKEN), ONCE, b"max").await.unwrap().is_accepted());
    assert_eq!(
        store.write(&name, token(MAX_STORED_TOKEN - 1), MANY, b"late").await.unwrap(),
        superseded(MAX_STORED_TOKEN, MAX_STORED_TOKEN - 1)
    );
    for bad in [0, MAX_STORED_TOKEN + 1, u64::MAX] {
        let error = store.write(&name, token(bad), MANY, b"bad").await.expect_err("out of range");
        assert!(matches!(error, FenceError::Invalid(_)), "{bad}: {error}");
        assert!(matches!(store.advance(&name, token(bad), MANY).await, Err(FenceError::Invalid(_))));
    }
    assert_eq!(
        read(&store, &name).await,
        Some(Record { token: token(MAX_STORED_TOKEN), value: Some(b"max".to_vec()) })
    );
}

async fn bad_resource_names_are_refused_before_the_store(opener: &impl Opener) {
    let store = opener.open().await;
    let long = "x".repeat(513);
    for name in ["", long.as_str()] {
        assert!(matches!(store.write(name, token(1), ONCE, b"v").await, Err(FenceError::Invalid(_))));
        assert!(matches!(store.read(name).await, Err(FenceError::Invalid(_))));
    }
    let mut longest = resource("longest");
    longest.push_str(&"y".repeat(512 - longest.len()));
    assert!(store.write(&longest, token(1), ONCE, b"v").await.unwrap().is_accepted());
    assert_eq!(read(&store, &longest).await.unwrap().token, token(1));
}

/// The value of the write whose answer the proxy loses (the proxy looks for it).
const LOST_VALUE: &[u8] = b"the-write-whose-answer-is-lost";

/// A write whose answer is lost is retried with the same token and value: in once per
/// grant the retry is refused by our own token (our first attempt landed), in many per
/// grant it is accepted again. The answer is lost for real where the store has a
/// connection: a proxy swallows it and closes the connection after the store applied
/// the write. The retry goes over a new connection, as a client's would.
async fn a_write_whose_answer_was_lost_is_retried(opener: &impl Opener, upstream: Option<SocketAddr>) {
    let name = resource("lost-answer");
    let proxy = match upstream {
        Some(upstream) => Some(LosingProxy::start(upstream, LOST_VALUE).await),
        None => None,
    };
    match proxy.as_ref().and_then(|proxy| opener.proxied(proxy.address)) {
        Some(through_proxy) => {
            let store = through_proxy.open().await;
            // The resource exists, so the first statement that carries the value is
            // the one that writes it (MySQL's fenced UPDATE matches nothing on a
            // resource's first write, and its answer would be lost with nothing
            // written).
            assert!(store.write(&name, token(29), ONCE, b"earlier").await.unwrap().is_accepted());
            let lost = store.write(&name, token(30), ONCE, LOST_VALUE).await;
            assert!(matches!(lost, Err(FenceError::Store { .. })), "the answer must be lost: {lost:?}");
        }
        None => {
            let store = opener.open().await;
            let _discarded = store.write(&name, token(30), ONCE, LOST_VALUE).await.unwrap();
        }
    }
    let store = opener.open().await;
    let retry = store.write(&name, token(30), ONCE, LOST_VALUE).await.unwrap();
    assert!(retry.is_ours(), "the lost write landed, so the retry meets our own token: {retry:?}");
    assert_eq!(read(&store, &name).await.unwrap().value, Some(LOST_VALUE.to_vec()));
    assert!(store.write(&name, token(31), MANY, b"many").await.unwrap().is_accepted());
    assert!(store.write(&name, token(31), MANY, b"many").await.unwrap().is_accepted());
    assert_eq!(read(&store, &name).await, Some(Record { token: token(31), value: Some(b"many".to_vec()) }));
}

/// Resource names compare as bytes: `a` and `a ` are two resources (MySQL's
/// `utf8mb4_bin` would pad spaces and give them one fence; the layout uses VARBINARY).
async fn a_trailing_space_names_another_resource(opener: &impl Opener) {
    let store = opener.open().await;
    let name = resource("spaced");
    assert!(store.write(&name, token(60), ONCE, b"no space").await.unwrap().is_accepted());
    assert!(store.write(&format!("{name} "), token(50), ONCE, b"space").await.unwrap().is_accepted());
    assert_eq!(read(&store, &name).await.unwrap().value, Some(b"no space".to_vec()));
    assert_eq!(read(&store, &format!("{name} ")).await.unwrap().value, Some(b"space".to_vec()));
}

/// Every case, in one test per adapter (the stores are shared; resources are not).
async fn conformance(opener: impl Opener, upstream: Option<SocketAddr>) {
    first_write_creates(&opener).await;
    an_older_token_is_refused_and_changes_nothing(&opener).await;
    the_same_token_once_and_many(&opener).await;
    advance_moves_the_fence_and_keeps_the_value(&opener).await;
    racing_writers_leave_only_the_newer_write(&opener).await;
    tokens_span_the_whole_signed_range(&opener).await;
    bad_resource_names_are_refused_before_the_store(&opener).await;
    a_write_whose_answer_was_lost_is_retried(&opener, upstream).await;
    a_trailing_space_names_another_resource(&opener).await;
}

/// The `host:port` of a store's URL.
fn address_of(url: &str) -> SocketAddr {
    let rest = url.split_once("://").unwrap().1;
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    authority.rsplit_once('@').map_or(authority, |(_, host)| host).parse().expect("host:port")
}

/// The fence survives the store's restart: written, restarted, then an older token is
/// still refused and the value is still there. The adapter that wrote before the
/// restart works after it: its first call may meet the broken connection and fail,
/// the retry (same token) goes over a new one.
async fn survives_a_restart(opener: impl Opener, restart: impl Fn()) {
    let name = resource("restart");
    let before = opener.open().await;
    assert!(before.write(&name, token(40), ONCE, b"before").await.unwrap().is_accepted());
    restart();
    let store = opener.open().await;
    assert_eq!(store.write(&name, token(39), MANY, b"stale").await.unwrap(), superseded(40, 39));
    assert_eq!(read(&store, &name).await, Some(Record { token: token(40), value: Some(b"before".to_vec()) }));
    assert!(store.write(&name, token(41), ONCE, b"after").await.unwrap().is_accepted());
    let outcome = match before.write(&name, token(42), MANY, b"again").await {
        Ok(outcome) => outcome,
        Err(_) => before.write(&name, token(42), MANY, b"again").await.expect("the retry after a restart"),
    };
    assert!(outcome.is_accepted(), "{outcome:?}");
    assert_eq!(read(&store, &name).await, Some(Record { token: token(42), value: Some(b"again".to_vec()) }));
}

mod postgres {
    use super::*;
    use leasehold::fence::postgres::PostgresFence;

    struct Open(String);
    impl Opener for Open {
        type Store = PostgresFence;
        async fn open(&self) -> PostgresFence {
            let fence = PostgresFence::connect(&self.0).await.expect("connect to PostgreSQL");
            fence.create_table().await.expect("create the fence table");
            fence
        }
        fn proxied(&self, proxy: SocketAddr) -> Option<Self> {
            Some(Open(through(&self.0, proxy)))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conformance() {
        let url = store_url("postgres", 0);
        super::conformance(Open(url.clone()), Some(address_of(&url))).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn survives_a_restart() {
        let url = store_url("postgres", 1);
        super::survives_a_restart(Open(url), || drop(stores("restart", "postgres", 1))).await;
        stores("stop", "postgres", 1);
    }

    /// `guard` fences the caller's own statements: the fence row stays locked until
    /// the caller's transaction ends, and a refused guard leaves the caller's row as
    /// it was.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn guard_fences_the_callers_transaction() {
        let url = store_url("postgres", 0);
        let fence = Open(url.clone()).open().await;
        let (mut orders, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let table = format!("orders_{}", rand::random::<u32>());
        orders.batch_execute(&format!("CREATE TABLE {table} (id INT PRIMARY KEY, status TEXT)")).await.unwrap();
        orders.execute(&format!("INSERT INTO {table} VALUES (42, 'new')"), &[]).await.unwrap();
        let name = resource("guard");
        for (ours, status) in [(8u64, "charged-by-8"), (7, "charged-by-7")] {
            let tx = orders.transaction().await.unwrap();
            match fence.guard(&tx, &name, token(ours), ONCE).await.unwrap() {
                Outcome::Accepted => {
                    tx.execute(&format!("UPDATE {table} SET status = $1 WHERE id = 42"), &[&status]).await.unwrap();
                    tx.commit().await.unwrap();
                }
                Outcome::Superseded { seen, .. } => {
                    assert_eq!((ours, seen), (7, token(8)));
                    tx.rollback().await.unwrap();
                }
            }
        }
        let row = orders.query_one(&format!("SELECT status FROM {table} WHERE id = 42"), &[]).await.unwrap();
        assert_eq!(row.get::<_, String>(0), "charged-by-8");
        orders.batch_execute(&format!("DROP TABLE {table}")).await.unwrap();
    }
}

mod sqlite {
    use super::*;
    use leasehold::fence::sqlite::SqliteFence;

    struct Open(PathBuf);
    impl Opener for Open {
        type Store = SqliteFence;
        async fn open(&self) -> SqliteFence {
            SqliteFence::open(&self.0).expect("open the SQLite file")
        }
        fn proxied(&self, _proxy: SocketAddr) -> Option<Self> {
            None
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conformance() {
        let directory = tempfile::tempdir().unwrap();
        super::conformance(Open(directory.path().join("fence.db")), None).await;
    }

    /// SQLite's "restart" is the file closed by every connection and opened again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn survives_a_restart() {
        let directory = tempfile::tempdir().unwrap();
        super::survives_a_restart(Open(directory.path().join("fence.db")), || ()).await;
    }

    #[test]
    fn a_table_name_that_is_not_an_identifier_is_refused() {
        let connection = rusqlite::Connection::open_in_memory().unwrap();
        for bad in ["", "fence; DROP TABLE x", "1fence", "a.b.c", "fence-table"] {
            let connection = rusqlite::Connection::open_in_memory().unwrap();
            assert!(matches!(SqliteFence::with_table(connection, bad), Err(FenceError::Invalid(_))), "{bad:?}");
        }
        assert!(SqliteFence::with_table(connection, "main.my_fence").is_ok());
    }
}

mod mariadb {
    use super::*;
    use leasehold::fence::mysql::MysqlFence;

    struct Open(String);
    impl Opener for Open {
        type Store = MysqlFence;
        async fn open(&self) -> MysqlFence {
            let fence = MysqlFence::connect(&self.0).expect("a MariaDB pool");
            fence.create_table().await.expect("create the fence table");
            fence
        }
        fn proxied(&self, proxy: SocketAddr) -> Option<Self> {
            // On a loopback address the driver moves to the server's Unix socket
            // (`@@socket`) after connecting, which would bypass the proxy.
            Some(Open(format!("{}?prefer_socket=false", through(&self.0, proxy))))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conformance() {
        let url = store_url("mariadb", 0);
        super::conformance(Open(url.clone()), Some(address_of(&url))).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn survives_a_restart() {
        let url = store_url("mariadb", 1);
        super::survives_a_restart(Open(url), || drop(stores("restart", "mariadb", 1))).await;
        stores("stop", "mariadb", 1);
    }
}

mod redis {
    use super::*;
    use leasehold::fence::redis::RedisFence;

    struct Open(String);
    impl Opener for Open {
        type Store = RedisFence;
        async fn open(&self) -> RedisFence {
            RedisFence::connect(&self.0).await.expect("connect to Redis")
        }
        fn proxied(&self, proxy: SocketAddr) -> Option<Self> {
            Some(Open(through(&self.0, proxy)))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conformance() {
        let url = store_url("redis", 0);
        super::conformance(Open(url.clone()), Some(address_of(&url))).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn survives_a_restart() {
        let url = store_url("redis", 1);
        super::survives_a_restart(Open(url), || drop(stores("restart", "redis", 1))).await;
        stores("stop", "redis", 1);
    }
}

mod etcd {
    use super::*;
    use leasehold::fence::etcd::EtcdFence;

    struct Open(String);
    impl Opener for Open {
        type Store = EtcdFence;
        async fn open(&self) -> EtcdFence {
            EtcdFence::connect(&self.0).await.expect("connect to etcd")
        }
        fn proxied(&self, proxy: SocketAddr) -> Option<Self> {
            Some(Open(through(&self.0, proxy)))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conformance() {
        let url = store_url("etcd", 0);
        super::conformance(Open(url.clone()), Some(address_of(&url))).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn survives_a_restart() {
        let url = store_url("etcd", 1);
        super::survives_a_restart(Open(url), || drop(stores("restart", "etcd", 1))).await;
        stores("stop", "etcd", 1);
    }
}

/// An S3 bucket with conditional writes: the tests' server is moto's, which checks
/// every request's signature. It keeps everything in memory and makes a new access
/// key when it starts, so there is no restart case: what survives a restart of S3 is
/// S3's to keep.
mod s3 {
    use super::*;
    use leasehold::fence::s3::S3Fence;

    struct Open(String);
    impl Opener for Open {
        type Store = S3Fence;
        async fn open(&self) -> S3Fence {
            S3Fence::connect(&self.0).expect("an S3 URL")
        }
        fn proxied(&self, proxy: SocketAddr) -> Option<Self> {
            Some(Open(through(&self.0, proxy)))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conformance() {
        let url = store_url("s3", 0);
        super::conformance(Open(url.clone()), Some(address_of(&url))).await;
    }

    /// A request signed with another secret is refused by the store, and the refusal
    /// is an error, not an outcome.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wrong_secret_is_refused_by_the_store() {
        let url = store_url("s3", 0);
        let (user, rest) = url.split_once('@').unwrap();
        let access = user.rsplit_once(':').unwrap().0;
        let store = S3Fence::connect(&format!("{access}:not-the-secret@{rest}")).unwrap();
        let error = store.write(&resource("wrong-secret"), token(1), ONCE, b"x").await.unwrap_err();
        assert!(matches!(error, FenceError::Store { .. }), "{error}");
        assert!(error.to_string().contains("403"), "the store's answer is named: {error}");
    }
}

/// An HTTP service fenced by the tower layer (`serve_fenced_kv` over a SQLite file),
/// spoken to by `HttpFence`: the header protocol end to end.
mod http {
    use super::*;
    use leasehold::fence::http::{serve_fenced_kv, HttpFence};
    use leasehold::fence::sqlite::SqliteFence;
    use tokio::sync::oneshot;
    use tokio::task::JoinHandle;

    /// A running service: sending on `stop` (or dropping it) ends it, `served` then
    /// completes with its listener closed.
    struct Served {
        address: SocketAddr,
        stop: oneshot::Sender<()>,
        served: JoinHandle<()>,
    }

    /// The service on `address` (a free port when it is port 0) over the SQLite file.
    async fn serve(file: &std::path::Path, address: SocketAddr) -> Served {
        let listener = TcpListener::bind(address).await.expect("bind the fenced service");
        let address = listener.local_addr().unwrap();
        let store = Arc::new(SqliteFence::open(file).expect("open the SQLite file"));
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(serve_fenced_kv(listener, store, async move {
            let _ = stopped.await;
        }));
        Served { address, stop, served }
    }

    struct Open(String);
    impl Opener for Open {
        type Store = HttpFence;
        async fn open(&self) -> HttpFence {
            HttpFence::new(&self.0).expect("an HTTP fence")
        }
        fn proxied(&self, proxy: SocketAddr) -> Option<Self> {
            Some(Open(through(&self.0, proxy)))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conformance() {
        let directory = tempfile::tempdir().unwrap();
        let service = serve(&directory.path().join("fence.db"), "127.0.0.1:0".parse().unwrap()).await;
        let address = service.address;
        super::conformance(Open(format!("http://{address}")), Some(address)).await;
    }

    /// The service stopped and started again on the same port over the same file.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn survives_a_restart() {
        let directory = tempfile::tempdir().unwrap();
        let file = directory.path().join("fence.db");
        let first = serve(&file, "127.0.0.1:0".parse().unwrap()).await;
        let address = first.address;
        let current = std::sync::Mutex::new(Some(first));
        let runtime = tokio::runtime::Handle::current();
        super::survives_a_restart(Open(format!("http://{address}")), || {
            tokio::task::block_in_place(|| {
                let Served { stop, served, .. } = current.lock().unwrap().take().expect("a running service");
                let _ = stop.send(());
                runtime.block_on(served).expect("the service stops");
                *current.lock().unwrap() = Some(runtime.block_on(serve(&file, address)));
            })
        })
        .await;
    }
}
