//! The Kubernetes API server and what both platforms share: storage, watches, the REST
//! handlers, authentication and RBAC, schemas and CEL, patches, tables, paging, discovery,
//! aggregation, pods and their streams, the guests behind VMs, the controllers' loop and VM
//! lifecycle (whose folders keep a `kubevirt.rs` and a `deckhouse.rs` beside the shared part).

pub mod admission;
pub mod aggregator;
pub mod app;
pub mod auth;
pub mod bootstrap;
pub mod cel;
pub mod controllers;
pub mod decoded;
pub mod discovery;
pub mod expansion;
pub mod expect;
pub mod faults;
pub mod fieldmanager;
pub mod file_server;
pub mod fixtures;
pub mod gc;
pub mod guest;
pub mod handlers;
pub mod hold;
pub mod http_import;
pub mod lifecycle;
pub mod openapi;
pub mod paging;
pub mod patch;
pub mod pod_portforward;
pub mod podexec;
pub mod podlog;
pub mod portforward;
pub mod protobuf;
pub mod qemu_guest;
pub mod quota;
pub mod registry;
pub mod requests;
pub mod reviews;
pub mod rfb;
pub mod sa_tokens;
pub mod schema;
pub mod selector;
pub mod services;
pub mod spdy;
pub mod sshd_guest;
pub mod status;
pub mod storage;
pub mod store;
pub mod strategy;
pub mod streams;
pub mod structural;
pub mod subresources;
pub mod table;
pub mod tls;
pub mod util;
pub mod watch;
