//! The server's model, independent of the socket: endpoints, the result cache and
//! singleflight, managed objects with per-connection leases, and tasks.
//!
//! Every request is handled by [`Service::handle`] on behalf of one connection. A
//! result that must stay alive on the server (a managed result, or one that shares
//! CUDA memory) becomes an *object*; the connection that received it holds a lease,
//! given back by `Release` or when the connection closes for any reason, including
//! the client's death. An object lives while it has a lease or a cache entry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock};
use std::time::Duration;

use crate::error::{IpcError, RemoteKind, Result};
use crate::schema::{
    self, EndpointInfo, EndpointOptions, Execution, Node, ObjectInfo, ObjectRef, Payload, Request,
    Response, ServerInfo, SharedValue,
};
use crate::tasks::{TaskLimits, TaskOutcome, TaskPool};
use crate::util::{hex, lock, now_secs};
use crate::value::{Incoming, Outgoing};

/// Runs an endpoint on its arguments.
pub type Handler = Arc<dyn Fn(Incoming) -> Result<Outgoing> + Send + Sync>;

/// Computes a call's cache key from its arguments (`None`: this call is not cached).
pub type CacheKeyFn = Arc<dyn Fn(&Payload) -> Result<Option<String>> + Send + Sync>;

/// Identifies a connection to the service.
pub type ConnectionId = u64;

/// An endpoint: a name, how it runs, and the function behind it.
pub struct Endpoint {
    name: String,
    options: EndpointOptions,
    handler: Handler,
    cache_key: Option<CacheKeyFn>,
    serial: Mutex<()>,
}

impl Endpoint {
    /// An endpoint running `handler`; `cache_key` computes call keys (the default
    /// key is the canonical encoding of arguments without tensors).
    pub fn new(
        name: impl Into<String>,
        options: EndpointOptions,
        handler: Handler,
        cache_key: Option<CacheKeyFn>,
    ) -> Endpoint {
        Endpoint {
            name: name.into(),
            options,
            handler,
            cache_key,
            serial: Mutex::new(()),
        }
    }

    fn key(&self, args: &Payload) -> Result<Option<String>> {
        match &self.cache_key {
            Some(f) => f(args),
            None => default_cache_key(args),
        }
    }

    fn run(&self, args: Incoming) -> std::result::Result<Outgoing, (RemoteKind, String)> {
        let _serial = (self.options.concurrency == schema::Concurrency::Serialized)
            .then(|| lock(&self.serial));
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.handler)(args))) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(match e {
                IpcError::Remote { kind, message } => (kind, message),
                other => (other.remote_kind(), other.to_string()),
            }),
            Err(_) => Err((
                RemoteKind::Internal,
                format!("endpoint {} panicked", self.name),
            )),
        }
    }
}

/// The default cache key: the canonical CBOR (maps sorted by key) of arguments
/// without tensors, in hex; `None` when they hold tensors (a tensor's identity is not
/// a sound key).
pub fn default_cache_key(args: &Payload) -> Result<Option<String>> {
    if !args.tensors.is_empty() {
        return Ok(None);
    }
    let bytes = schema::encode(&canonical(&args.value))?;
    Ok(Some(hex(&bytes)))
}

fn canonical(node: &Node) -> Node {
    match node {
        Node::List(items) => Node::List(items.iter().map(canonical).collect()),
        Node::Tuple(items) => Node::Tuple(items.iter().map(canonical).collect()),
        Node::Map(entries) => {
            let mut sorted: Vec<(String, Node)> = entries
                .iter()
                .map(|(k, v)| (k.clone(), canonical(v)))
                .collect();
            sorted.sort_by(|a, b| a.0.cmp(&b.0));
            Node::Map(sorted)
        }
        Node::Tagged(tag, inner) => Node::Tagged(tag.clone(), Box::new(canonical(inner))),
        other => other.clone(),
    }
}

/// Limits of a [`Service`].
#[derive(Debug, Clone, Copy)]
pub struct ServiceLimits {
    /// Objects alive at once; more results are refused with `Busy`.
    pub max_objects: usize,
    /// Cached results kept at once; storing one more drops the least recently used
    /// (its object lives on while clients hold leases on it).
    pub max_cache_entries: usize,
    /// Longest a `WaitTask` (or a `Call` of a task endpoint) waits.
    pub max_wait: Duration,
    /// The task pool.
    pub tasks: TaskLimits,
}

impl Default for ServiceLimits {
    fn default() -> Self {
        ServiceLimits {
            max_objects: 65_536,
            max_cache_entries: 1024,
            max_wait: Duration::from_secs(3600),
            tasks: TaskLimits::default(),
        }
    }
}

type CacheKey = (String, String);

struct CacheEntry {
    value: Outgoing,
    /// Which store this is (unique per service): a computed value names the entry it
    /// came from or went into by it.
    serial: u64,
    object_id: Option<String>,
    /// When it was last stored or hit (a logical clock), for LRU eviction.
    used: u64,
}

struct Object {
    endpoint: String,
    cache_key: Option<String>,
    value: Outgoing,
    leases: HashMap<ConnectionId, u64>,
    cached: bool,
    created_at: f64,
    last_accessed_at: f64,
}

impl Object {
    fn lease_count(&self) -> u64 {
        self.leases.values().sum()
    }
}

#[derive(Default)]
struct State {
    cache: HashMap<CacheKey, CacheEntry>,
    objects: HashMap<String, Object>,
    next_object: u64,
    clock: u64,
}

impl State {
    /// Drops the object when nothing holds it any more.
    fn maybe_drop(&mut self, id: &str) {
        if self
            .objects
            .get(id)
            .is_some_and(|o| !o.cached && o.lease_count() == 0)
        {
            self.objects.remove(id);
        }
    }

    fn uncache(&mut self, key: &CacheKey) -> bool {
        match self.cache.remove(key) {
            Some(entry) => {
                if let Some(id) = entry.object_id {
                    if let Some(o) = self.objects.get_mut(&id) {
                        o.cached = false;
                    }
                    self.maybe_drop(&id);
                }
                true
            }
            None => false,
        }
    }
}

/// A built value and the serial of the cache entry it was stored in, if any.
type Built = (Outgoing, Option<u64>);

struct Flight {
    /// The leader's result.
    outcome: Mutex<Option<TaskOutcome<Built>>>,
    done: Condvar,
}

/// A computed result and where it came from.
#[derive(Clone)]
pub struct Computed {
    value: Outgoing,
    endpoint: Arc<Endpoint>,
    key: Option<String>,
    cached: bool,
    /// The serial of the cache entry holding this value, when one does.
    entry: Option<u64>,
}

/// Named counters the server reports.
#[derive(Default)]
pub struct Counters {
    /// Requests handled.
    pub requests: AtomicU64,
    /// Endpoint calls (direct and task).
    pub calls: AtomicU64,
    /// Endpoint functions actually run.
    pub builds: AtomicU64,
    /// Calls answered from the cache.
    pub cache_hits: AtomicU64,
    /// Cacheable calls that were not in the cache.
    pub cache_misses: AtomicU64,
    /// Cached results dropped to make room (least recently used first).
    pub cache_evictions: AtomicU64,
    /// Calls that waited for an identical call in flight instead of building.
    pub singleflight_waits: AtomicU64,
    /// Tasks submitted.
    pub tasks_submitted: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections open now.
    pub connections_open: AtomicU64,
    /// Peers refused by the credential check.
    pub peers_refused: AtomicU64,
    /// Requests that failed.
    pub errors: AtomicU64,
    /// Leases given back because their connection closed.
    pub leases_dropped_on_disconnect: AtomicU64,
}

/// The server's model: endpoints, cache, objects, tasks.
pub struct Service {
    server_id: String,
    limits: ServiceLimits,
    endpoints: RwLock<HashMap<String, Arc<Endpoint>>>,
    state: Mutex<State>,
    flights: Mutex<HashMap<CacheKey, Arc<Flight>>>,
    tasks: TaskPool<Computed>,
    /// The counters.
    pub counters: Counters,
}

impl Service {
    /// A service with no endpoints; `server_id` names it in every object reference.
    pub fn new(server_id: String, limits: ServiceLimits) -> Result<Arc<Service>> {
        let tasks = TaskPool::new(
            limits.tasks,
            &format!("task-{}", &server_id[..8.min(server_id.len())]),
        )?;
        Ok(Arc::new(Service {
            server_id,
            limits,
            endpoints: RwLock::new(HashMap::new()),
            state: Mutex::new(State::default()),
            flights: Mutex::new(HashMap::new()),
            tasks,
            counters: Counters::default(),
        }))
    }

    /// The server's id.
    pub fn server_id(&self) -> &str {
        &self.server_id
    }

    /// Adds (or replaces) an endpoint.
    pub fn register(&self, endpoint: Endpoint) {
        self.endpoints
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(endpoint.name.clone(), Arc::new(endpoint));
    }

    /// The endpoints, sorted by name.
    pub fn endpoints(&self) -> Vec<EndpointInfo> {
        let map = self
            .endpoints
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let mut list: Vec<EndpointInfo> = map
            .values()
            .map(|e| EndpointInfo {
                name: e.name.clone(),
                options: e.options.clone(),
            })
            .collect();
        list.sort_by(|a, b| a.name.cmp(&b.name));
        list
    }

    fn endpoint(&self, name: &str) -> Result<Arc<Endpoint>> {
        self.endpoints
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
            .ok_or_else(|| {
                IpcError::remote(
                    RemoteKind::UnknownEndpoint,
                    format!("no endpoint named {name:?}"),
                )
            })
    }

    /// Answers one request from connection `conn`; returns the response and the value
    /// whose descriptors go with it.
    pub fn handle(
        self: &Arc<Self>,
        conn: ConnectionId,
        request: Request,
        fds: Vec<std::os::fd::OwnedFd>,
    ) -> (Response, Option<Outgoing>) {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        match self.dispatch(conn, request, fds) {
            Ok(answer) => answer,
            Err(e) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                let (kind, message) = match e {
                    IpcError::Remote { kind, message } => (kind, message),
                    other => (other.remote_kind(), other.to_string()),
                };
                (Response::Error { kind, message }, None)
            }
        }
    }

    fn dispatch(
        self: &Arc<Self>,
        conn: ConnectionId,
        request: Request,
        fds: Vec<std::os::fd::OwnedFd>,
    ) -> Result<(Response, Option<Outgoing>)> {
        let plain = |r: Response| Ok((r, None));
        match request {
            Request::Hello { .. } => plain(Response::Hello {
                server_id: self.server_id.clone(),
                version: env!("CARGO_PKG_VERSION").into(),
            }),
            Request::Ping => plain(Response::Pong),
            Request::ServerInfo => unreachable_info(),
            Request::ListEndpoints => plain(Response::Endpoints(self.endpoints())),
            Request::Call { endpoint, args } => {
                let args = Incoming::new(args, fds)?;
                let computed = self.call(&endpoint, args)?;
                let shared = self.deliver(Some(conn), &computed)?;
                Ok((Response::Value(shared), Some(computed.value)))
            }
            Request::Submit { endpoint, args } => {
                let args = Incoming::new(args, fds)?;
                plain(Response::TaskId(self.submit(&endpoint, args)?))
            }
            Request::TaskStatus { task_id } => plain(Response::Task(self.tasks.info(&task_id)?)),
            Request::WaitTask {
                task_id,
                timeout_ms,
            } => {
                let wait = timeout_ms
                    .map(Duration::from_millis)
                    .unwrap_or(self.limits.max_wait)
                    .min(self.limits.max_wait);
                plain(Response::Task(self.tasks.wait(&task_id, wait)?))
            }
            Request::TaskResult { task_id } => {
                let computed = self
                    .tasks
                    .outcome(&task_id)?
                    .map_err(|(kind, message)| IpcError::Remote { kind, message })?;
                let shared = self.deliver(Some(conn), &computed)?;
                Ok((Response::Value(shared), Some(computed.value)))
            }
            Request::CancelTask { task_id } => {
                plain(Response::Cancelled(self.tasks.cancel(&task_id)?))
            }
            Request::ListTasks { state } => plain(Response::Tasks(self.tasks.list(state))),
            Request::Release { object_ids } => {
                plain(Response::Released(self.release(conn, &object_ids)))
            }
            Request::ObjectInfo { object_id } => {
                plain(Response::Object(self.object_info(&object_id)))
            }
            Request::InvalidateCall { endpoint, args } => {
                let ep = self.endpoint(&endpoint)?;
                let dropped = match ep.key(&args)? {
                    Some(key) => u64::from(lock(&self.state).uncache(&(endpoint, key))),
                    None => 0,
                };
                plain(Response::Invalidated(dropped))
            }
            Request::InvalidateEndpoint { endpoint } => {
                self.endpoint(&endpoint)?;
                plain(Response::Invalidated(self.invalidate_endpoint(&endpoint)))
            }
        }
    }

    /// Runs a call through the cache, singleflight and (for task endpoints) the pool.
    pub fn call(self: &Arc<Self>, endpoint: &str, args: Incoming) -> Result<Computed> {
        let ep = self.endpoint(endpoint)?;
        if ep.options.execution == Execution::Task {
            let id = self.submit(endpoint, args)?;
            self.tasks.wait(&id, self.limits.max_wait)?;
            return self
                .tasks
                .outcome(&id)?
                .map_err(|(kind, message)| IpcError::Remote { kind, message });
        }
        self.compute(&ep, args)
            .map_err(|(kind, message)| IpcError::Remote { kind, message })
    }

    /// Queues a call on the task pool.
    pub fn submit(self: &Arc<Self>, endpoint: &str, args: Incoming) -> Result<String> {
        let ep = self.endpoint(endpoint)?;
        let service = Arc::downgrade(self);
        // A serialized endpoint's tasks wait in the queue, not in a worker.
        let gate =
            (ep.options.concurrency == schema::Concurrency::Serialized).then(|| ep.name.clone());
        let id = self
            .tasks
            .submit_gated(endpoint, gate, move || match service.upgrade() {
                Some(service) => service.compute(&ep, args),
                None => Err((RemoteKind::ShuttingDown, "server stopped".into())),
            })?;
        self.counters
            .tasks_submitted
            .fetch_add(1, Ordering::Relaxed);
        Ok(id)
    }

    fn compute(&self, ep: &Arc<Endpoint>, args: Incoming) -> TaskOutcome<Computed> {
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        let opts = &ep.options;
        let key = if opts.cache || opts.singleflight {
            ep.key(&args.payload).map_err(|e| match e {
                // The endpoint's own key function failed (a `cache_format_key` naming
                // no argument): the server's fault, kept as the function reported it.
                IpcError::Remote { kind, message } => (kind, format!("cache key: {message}")),
                other => (RemoteKind::BadRequest, format!("cache key: {other}")),
            })?
        } else {
            None
        };
        let computed = |value: Outgoing, cached: bool, entry: Option<u64>| Computed {
            value,
            endpoint: ep.clone(),
            key: key.clone(),
            cached,
            entry,
        };
        let Some(k) = key.clone() else {
            return self.build(ep, args).map(|v| computed(v, false, None));
        };
        let cache_key = (ep.name.clone(), k);
        if opts.cache {
            let mut state = lock(&self.state);
            state.clock += 1;
            let now = state.clock;
            if let Some(entry) = state.cache.get_mut(&cache_key) {
                entry.used = now;
                self.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(computed(entry.value.clone(), true, Some(entry.serial)));
            }
            drop(state);
            self.counters.cache_misses.fetch_add(1, Ordering::Relaxed);
        }
        if !opts.singleflight {
            let value = self.build(ep, args)?;
            let entry = opts.cache.then(|| self.store(&cache_key, &value));
            return Ok(computed(value, false, entry));
        }
        let (flight, leader) = {
            let mut flights = lock(&self.flights);
            match flights.get(&cache_key) {
                Some(f) => (f.clone(), false),
                None => {
                    let f = Arc::new(Flight {
                        outcome: Mutex::new(None),
                        done: Condvar::new(),
                    });
                    flights.insert(cache_key.clone(), f.clone());
                    (f, true)
                }
            }
        };
        if !leader {
            self.counters
                .singleflight_waits
                .fetch_add(1, Ordering::Relaxed);
            let mut outcome = lock(&flight.outcome);
            while outcome.is_none() {
                outcome = flight
                    .done
                    .wait(outcome)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            let outcome = outcome
                .clone()
                .unwrap_or_else(|| Err((RemoteKind::Internal, "empty flight".into())));
            // Shared with the leader's build: from the cache only when caching is on.
            return outcome.map(|(v, entry)| computed(v, opts.cache, entry));
        }
        let outcome = self.build(ep, args).map(|value| {
            // Cached before the flight ends, so later callers hit the cache.
            let entry = opts.cache.then(|| self.store(&cache_key, &value));
            (value, entry)
        });
        *lock(&flight.outcome) = Some(outcome.clone());
        flight.done.notify_all();
        lock(&self.flights).remove(&cache_key);
        outcome.map(|(v, entry)| computed(v, false, entry))
    }

    fn build(&self, ep: &Endpoint, args: Incoming) -> TaskOutcome<Outgoing> {
        self.counters.builds.fetch_add(1, Ordering::Relaxed);
        ep.run(args)
    }

    /// Caches `value` under `key`; returns the new entry's serial.
    fn store(&self, key: &CacheKey, value: &Outgoing) -> u64 {
        let mut state = lock(&self.state);
        state.uncache(key);
        while state.cache.len() >= self.limits.max_cache_entries.max(1) {
            let Some(oldest) = state
                .cache
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            state.uncache(&oldest);
            self.counters
                .cache_evictions
                .fetch_add(1, Ordering::Relaxed);
        }
        state.clock += 1;
        let serial = state.clock;
        state.cache.insert(
            key.clone(),
            CacheEntry {
                value: value.clone(),
                serial,
                object_id: None,
                used: serial,
            },
        );
        serial
    }

    /// Turns a computed value into what one connection receives: when the value must
    /// stay alive on the server (managed endpoint, or CUDA memory), an object with one
    /// lease for `conn`.
    fn deliver(&self, conn: Option<ConnectionId>, computed: &Computed) -> Result<SharedValue> {
        let ep = &computed.endpoint;
        // Checked before any lease is granted: an answer that cannot be sent must not
        // leave one behind.
        let segments = computed.value.segments.len();
        if segments > crate::frame::MAX_FDS_PER_FRAME {
            return Err(IpcError::remote(
                RemoteKind::Unshareable,
                format!(
                    "the result spans {segments} shared-memory segments, above the {} one answer carries",
                    crate::frame::MAX_FDS_PER_FRAME
                ),
            ));
        }
        let mut object = None;
        if let Some(conn) = conn {
            if ep.options.managed || computed.value.needs_keepalive() {
                let id = self.lease(conn, computed)?;
                object = Some(ObjectRef {
                    object_id: id,
                    server_id: self.server_id.clone(),
                    managed: ep.options.managed,
                });
            }
        }
        Ok(SharedValue {
            payload: computed.value.payload.clone(),
            object,
            cached: computed.cached,
        })
    }

    fn lease(&self, conn: ConnectionId, computed: &Computed) -> Result<String> {
        let now = now_secs();
        let mut state = lock(&self.state);
        let cache_key = computed
            .key
            .as_ref()
            .map(|k| (computed.endpoint.name.clone(), k.clone()));
        // The cached value's object, when this value is that cache entry's.
        let existing = cache_key.as_ref().and_then(|k| {
            state
                .cache
                .get(k)
                .filter(|e| Some(e.serial) == computed.entry)
                .and_then(|e| e.object_id.clone())
                .filter(|id| state.objects.contains_key(id))
        });
        let id = match existing {
            Some(id) => id,
            None => {
                if state.objects.len() >= self.limits.max_objects {
                    return Err(IpcError::remote(
                        RemoteKind::Busy,
                        format!("{} objects alive, the limit", self.limits.max_objects),
                    ));
                }
                state.next_object += 1;
                let id = format!(
                    "{}-obj-{}",
                    &self.server_id[..8.min(self.server_id.len())],
                    state.next_object
                );
                let cached = match cache_key.as_ref().and_then(|k| state.cache.get_mut(k)) {
                    Some(entry) if Some(entry.serial) == computed.entry => {
                        entry.object_id = Some(id.clone());
                        true
                    }
                    _ => false,
                };
                state.objects.insert(
                    id.clone(),
                    Object {
                        endpoint: computed.endpoint.name.clone(),
                        cache_key: computed.key.clone(),
                        value: computed.value.clone(),
                        leases: HashMap::new(),
                        cached,
                        created_at: now,
                        last_accessed_at: now,
                    },
                );
                id
            }
        };
        if let Some(object) = state.objects.get_mut(&id) {
            *object.leases.entry(conn).or_default() += 1;
            object.last_accessed_at = now;
        }
        Ok(id)
    }

    /// Gives back one lease per id held by `conn`.
    pub fn release(&self, conn: ConnectionId, ids: &[String]) -> Vec<bool> {
        let mut state = lock(&self.state);
        ids.iter()
            .map(|id| {
                let released = match state
                    .objects
                    .get_mut(id)
                    .and_then(|o| o.leases.get_mut(&conn))
                {
                    Some(n) if *n > 0 => {
                        *n -= 1;
                        true
                    }
                    _ => false,
                };
                if let Some(o) = state.objects.get_mut(id) {
                    o.leases.retain(|_, n| *n > 0);
                }
                state.maybe_drop(id);
                released
            })
            .collect()
    }

    /// Gives back every lease `conn` holds (it closed, or its process died).
    pub fn disconnect(&self, conn: ConnectionId) {
        let mut state = lock(&self.state);
        let mut dropped = 0;
        let ids: Vec<String> = state
            .objects
            .iter_mut()
            .filter_map(|(id, o)| {
                o.leases.remove(&conn).map(|n| {
                    dropped += n;
                    id.clone()
                })
            })
            .collect();
        for id in ids {
            state.maybe_drop(&id);
        }
        self.counters
            .leases_dropped_on_disconnect
            .fetch_add(dropped, Ordering::Relaxed);
    }

    /// An object's bookkeeping.
    pub fn object_info(&self, id: &str) -> Option<ObjectInfo> {
        let state = lock(&self.state);
        state.objects.get(id).map(|o| ObjectInfo {
            object_id: id.to_owned(),
            server_id: self.server_id.clone(),
            endpoint: o.endpoint.clone(),
            cache_key: o.cached.then(|| o.cache_key.clone()).flatten(),
            leases: o.lease_count(),
            created_at: o.created_at,
            last_accessed_at: o.last_accessed_at,
            bytes: o.value.bytes(),
        })
    }

    /// Drops every cached result of `endpoint`; returns how many.
    pub fn invalidate_endpoint(&self, endpoint: &str) -> u64 {
        let mut state = lock(&self.state);
        let keys: Vec<CacheKey> = state
            .cache
            .keys()
            .filter(|(e, _)| e == endpoint)
            .cloned()
            .collect();
        for key in &keys {
            state.uncache(key);
        }
        keys.len() as u64
    }

    /// Drops the cached result of one call by its key.
    pub fn invalidate_key(&self, endpoint: &str, key: &str) -> bool {
        lock(&self.state).uncache(&(endpoint.to_owned(), key.to_owned()))
    }

    /// Objects and leases alive now.
    pub fn live(&self) -> (u64, u64) {
        let state = lock(&self.state);
        let leases = state.objects.values().map(Object::lease_count).sum();
        (state.objects.len() as u64, leases)
    }

    /// The counters, by name (plus live objects, leases and cache entries).
    pub fn counter_list(&self) -> Vec<(String, u64)> {
        let c = &self.counters;
        let (objects, leases) = self.live();
        let cached = lock(&self.state).cache.len() as u64;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("requests".into(), load(&c.requests)),
            ("calls".into(), load(&c.calls)),
            ("builds".into(), load(&c.builds)),
            ("cache_hits".into(), load(&c.cache_hits)),
            ("cache_misses".into(), load(&c.cache_misses)),
            ("cache_entries".into(), cached),
            ("cache_evictions".into(), load(&c.cache_evictions)),
            ("singleflight_waits".into(), load(&c.singleflight_waits)),
            ("tasks_submitted".into(), load(&c.tasks_submitted)),
            ("objects_live".into(), objects),
            ("leases_live".into(), leases),
            (
                "leases_dropped_on_disconnect".into(),
                load(&c.leases_dropped_on_disconnect),
            ),
            ("connections".into(), load(&c.connections)),
            ("connections_open".into(), load(&c.connections_open)),
            ("peers_refused".into(), load(&c.peers_refused)),
            ("errors".into(), load(&c.errors)),
        ]
    }

    /// Stops the task pool (queued tasks are cancelled).
    pub fn shutdown(&self) {
        self.tasks.shutdown();
    }

    /// Fills in what only the service knows of a [`ServerInfo`].
    pub fn info(&self, socket_path: &str, started_at: f64, devices: Vec<String>) -> ServerInfo {
        ServerInfo {
            server_id: self.server_id.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            protocol: crate::frame::PROTOCOL_VERSION,
            pid: std::process::id(),
            socket_path: socket_path.into(),
            started_at,
            devices,
            counters: self.counter_list(),
        }
    }
}

/// `ServerInfo` needs the socket's details, so the server answers it itself.
fn unreachable_info() -> Result<(Response, Option<Outgoing>)> {
    Err(IpcError::remote(
        RemoteKind::Internal,
        "ServerInfo is answered by the socket server",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Concurrency;
    use std::sync::atomic::AtomicUsize;

    fn service() -> Arc<Service> {
        Service::new("0123456789abcdef".into(), ServiceLimits::default()).unwrap()
    }

    fn int_args(n: i64) -> Arc<Payload> {
        Arc::new(Payload::plain(Node::Tuple(vec![Node::Int(n)])))
    }

    fn call(s: &Arc<Service>, conn: ConnectionId, ep: &str, n: i64) -> Response {
        s.handle(
            conn,
            Request::Call {
                endpoint: ep.into(),
                args: int_args(n),
            },
            vec![],
        )
        .0
    }

    fn counting(
        s: &Arc<Service>,
        name: &str,
        options: EndpointOptions,
        delay: Duration,
    ) -> Arc<AtomicUsize> {
        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        s.register(Endpoint::new(
            name,
            options,
            Arc::new(move |args: Incoming| {
                r.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(delay);
                Ok(Outgoing::plain(args.payload.value.clone()))
            }),
            None,
        ));
        runs
    }

    #[test]
    fn cache_and_managed_objects_with_leases() {
        let s = service();
        let managed = EndpointOptions {
            managed: true,
            ..EndpointOptions::default()
        };
        let runs = counting(&s, "load", managed, Duration::ZERO);
        let Response::Value(first) = call(&s, 1, "load", 4) else {
            panic!()
        };
        let Response::Value(second) = call(&s, 2, "load", 4) else {
            panic!()
        };
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the second call is a cache hit"
        );
        assert!(!first.cached && second.cached);
        let id = first.object.unwrap().object_id;
        assert_eq!(
            second.object.unwrap().object_id,
            id,
            "one object per cache entry"
        );
        assert_eq!(s.object_info(&id).unwrap().leases, 2);
        // Connection 1 releases once (a second release has nothing to give back).
        assert_eq!(s.release(1, std::slice::from_ref(&id)), vec![true]);
        assert_eq!(s.release(1, std::slice::from_ref(&id)), vec![false]);
        // Connection 2 dies: its lease goes; the cache still holds the object.
        s.disconnect(2);
        assert_eq!(s.object_info(&id).unwrap().leases, 0);
        assert_eq!(s.invalidate_endpoint("load"), 1);
        assert!(s.object_info(&id).is_none(), "uncached and unleased: gone");
        call(&s, 1, "load", 4);
        assert_eq!(runs.load(Ordering::SeqCst), 2, "rebuilt after invalidation");
    }

    #[test]
    fn the_cache_drops_its_least_recently_used_entry() {
        let limits = ServiceLimits {
            max_cache_entries: 2,
            ..ServiceLimits::default()
        };
        let s = Service::new("0123456789abcdef".into(), limits).unwrap();
        let runs = counting(&s, "f", EndpointOptions::default(), Duration::ZERO);
        call(&s, 1, "f", 1);
        call(&s, 1, "f", 2);
        call(&s, 1, "f", 1); // hit: 1 is now more recent than 2
        call(&s, 1, "f", 3); // evicts 2
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        call(&s, 1, "f", 1);
        assert_eq!(runs.load(Ordering::SeqCst), 3, "1 stayed cached");
        call(&s, 1, "f", 2);
        assert_eq!(runs.load(Ordering::SeqCst), 4, "2 was evicted");
        assert_eq!(s.counters.cache_evictions.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn singleflight_builds_once_under_concurrency() {
        let s = service();
        let runs = Arc::new(AtomicUsize::new(0));
        let (r, weak) = (runs.clone(), Arc::downgrade(&s));
        // The build lasts until the other seven callers wait on it (not a fixed time a
        // stalled thread could miss); past a long deadline the counts below fail.
        s.register(Endpoint::new(
            "slow",
            EndpointOptions::default(),
            Arc::new(move |args: Incoming| {
                r.fetch_add(1, Ordering::SeqCst);
                let deadline = std::time::Instant::now() + Duration::from_secs(30);
                while weak
                    .upgrade()
                    .is_some_and(|s| s.counters.singleflight_waits.load(Ordering::SeqCst) < 7)
                    && std::time::Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(Outgoing::plain(args.payload.value.clone()))
            }),
            None,
        ));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let s = s.clone();
                std::thread::spawn(move || call(&s, i, "slow", 7))
            })
            .collect();
        for t in threads {
            assert!(matches!(t.join().unwrap(), Response::Value(_)));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(s.counters.singleflight_waits.load(Ordering::SeqCst), 7);
    }

    #[test]
    fn serialized_endpoints_do_not_overlap() {
        let s = service();
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (i2, m2) = (inside.clone(), most.clone());
        s.register(Endpoint::new(
            "one",
            EndpointOptions {
                concurrency: Concurrency::Serialized,
                cache: false,
                singleflight: false,
                ..EndpointOptions::default()
            },
            Arc::new(move |_| {
                let now = i2.fetch_add(1, Ordering::SeqCst) + 1;
                m2.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
                i2.fetch_sub(1, Ordering::SeqCst);
                Ok(Outgoing::plain(Node::Null))
            }),
            None,
        ));
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let s = s.clone();
                std::thread::spawn(move || call(&s, i, "one", i as i64))
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn errors_are_typed_and_tasks_run() {
        let s = service();
        assert!(matches!(
            call(&s, 1, "nope", 1),
            Response::Error {
                kind: RemoteKind::UnknownEndpoint,
                ..
            }
        ));
        s.register(Endpoint::new(
            "fails",
            EndpointOptions::default(),
            Arc::new(|_| {
                Err(IpcError::remote(
                    RemoteKind::EndpointFailed,
                    "ValueError: no",
                ))
            }),
            None,
        ));
        let Response::Error { kind, message } = call(&s, 1, "fails", 1) else {
            panic!()
        };
        assert_eq!(kind, RemoteKind::EndpointFailed);
        assert!(message.contains("ValueError"));
        let task_ep = EndpointOptions {
            execution: Execution::Task,
            managed: true,
            ..EndpointOptions::default()
        };
        counting(&s, "build", task_ep, Duration::from_millis(10));
        let (Response::TaskId(id), _) = s.handle(
            3,
            Request::Submit {
                endpoint: "build".into(),
                args: int_args(2),
            },
            vec![],
        ) else {
            panic!()
        };
        let (Response::Task(info), _) = s.handle(
            3,
            Request::WaitTask {
                task_id: id.clone(),
                timeout_ms: Some(5000),
            },
            vec![],
        ) else {
            panic!()
        };
        assert_eq!(info.state, crate::schema::TaskState::Completed);
        let (Response::Value(v), _) = s.handle(3, Request::TaskResult { task_id: id }, vec![])
        else {
            panic!()
        };
        assert_eq!(v.payload.value, Node::Tuple(vec![Node::Int(2)]));
        assert!(v.object.unwrap().managed);
        // A call of a task endpoint runs on the pool and waits; same cache entry.
        let Response::Value(v) = call(&s, 4, "build", 2) else {
            panic!()
        };
        assert!(v.cached);
    }

    #[test]
    fn default_keys_ignore_map_order_and_skip_tensors() {
        let a = Payload::plain(Node::Map(vec![
            ("x".into(), Node::Int(1)),
            ("y".into(), Node::Int(2)),
        ]));
        let b = Payload::plain(Node::Map(vec![
            ("y".into(), Node::Int(2)),
            ("x".into(), Node::Int(1)),
        ]));
        assert_eq!(
            default_cache_key(&a).unwrap(),
            default_cache_key(&b).unwrap()
        );
        let mut t = a.clone();
        t.tensors.push(crate::schema::TensorDesc {
            storage: 0,
            offset: 0,
            dtype: "u8".into(),
            shape: vec![],
            strides: vec![],
            framework: crate::schema::Framework::Numpy,
            requires_grad: false,
        });
        assert_eq!(default_cache_key(&t).unwrap(), None);
    }
}
