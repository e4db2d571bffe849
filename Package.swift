// swift-tools-version:6.1
import PackageDescription

let package = Package(
    name: "opqueued",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "OperationEngine", targets: ["OperationEngine"]),
        .executable(name: "opqueued", targets: ["opqueued"]),
        .executable(name: "opqueuectl", targets: ["opqueuectl"]),
        .executable(name: "opqueued-supervise", targets: ["opqueued-supervise"]),
        .executable(name: "opqueue-bench", targets: ["opqueue-bench"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-collections.git", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        // Traces (SPEC §6 tracing.otlp): OTLP/HTTP only, so gRPC and its code generation stay out of the build.
        .package(url: "https://github.com/swift-otel/swift-otel.git", from: "1.6.0", traits: ["OTLPHTTP"]),
        .package(url: "https://github.com/apple/swift-distributed-tracing.git", from: "1.7.3"),
    ],
    targets: [
        // The process between the daemon and each command: ends whatever the command started (main.c says how).
        // Linked statically, and without the Swift runtime SwiftPM links into every executable (runtime.c says how):
        // loading and starting either would cost each command time.
        .executableTarget(name: "opqueued-supervise",
                          linkerSettings: [.unsafeFlags(["-static-executable", "-use-ld=lld"])]),
        // System calls with EINTR retried in one place.
        .target(name: "SystemCalls"),
        // Thread priority, SCHED_IDLE and I/O priority: `syscall` is variadic, Swift cannot call it.
        .target(name: "CShims"),
        // opqueued only: notes SIGTERM, SIGINT and SIGHUP before main (a constructor), so that a signal while starting
        // does not end the process with its default action.
        .target(name: "COpqueuedStart", dependencies: ["CShims"]),
        // libjpeg-turbo and libpng behind functions that return codes: setjmp stays in C.
        .target(name: "CCodecs", linkerSettings: [.linkedLibrary("jpeg"), .linkedLibrary("png16")]),
        // libcurl's multi interface with typed option setters (curl_easy_setopt is variadic).
        .target(name: "CCurl", linkerSettings: [.linkedLibrary("curl")]),
        // libsystemd: sd_journal_sendv and sd_notify.
        .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),
        // Logging to journald (sd_journal_sendv from a writer thread) and to the console, as swift-log handlers;
        // sd_notify for the service manager.
        .target(
            name: "SystemdJournal",
            dependencies: ["CSystemd", "SystemCalls", .product(name: "Logging", package: "swift-log")]
        ),
        // XML and binary property lists without Foundation: compact values, a streaming writer.
        .target(name: "PropertyList"),
        // Cron expressions and TZif time zones for schedules (SPEC §3.7): pure, no Foundation.
        .target(name: "Cron", dependencies: ["SystemCalls"]),
        // The job model: manifests and their plans, the configuration, the job lifecycle and schedules, as values and
        // pure state machines: no spool, no journal, no C library. The manifest fuzzer builds it on its own.
        .target(name: "JobModel", dependencies: ["OperationEngine", "PropertyList", "Cron"]),
        // The spool's file primitives: reads that trust no file to be what it is named, whole and durable writes,
        // tree removal, SpoolError, and the crash points of the reliability campaign.
        .target(name: "SpoolFiles", dependencies: ["CShims", "SystemCalls", "JobModel"]),
        // The operation kinds (SPEC §3.3): images and the fused strip pipeline, downloads and their networks,
        // commands and the processes that run them.
        .target(
            name: "OperationKinds",
            dependencies: [
                "JobModel",
                "OperationEngine",
                "SpoolFiles",
                "CShims",
                "CCodecs",
                "CCurl",
                "SystemCalls",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The control plane's transport: the control socket's server and client, typed requests and answers, the
        // /metrics listener, on SwiftNIO. What is answered is the daemon's (its handler is a closure).
        .target(
            name: "ControlPlane",
            dependencies: [
                "JobModel",
                "SpoolFiles",
                "SystemCalls",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
        // The daemon: spool protocol, the cluster, the answers to the control plane; the shell around JobModel.
        .target(
            name: "Daemon",
            dependencies: [
                "ControlPlane",
                "JobModel",
                "OperationEngine",
                "OperationKinds",
                "PropertyList",
                "SpoolFiles",
                "SystemdJournal",
                "CShims",
                "SystemCalls",
                "Cron",
                // The cluster (SPEC §8): Sources/Daemon/Cluster implements the JobStore over it.
                "ClusterStore",
                "JobTracing",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "HeapModule", package: "swift-collections"),
                // Metrics (SPEC §6): recorded through swift-metrics into a swift-prometheus registry; the
                // optional HTTP /metrics listener runs on SwiftNIO.
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                // The node's services (Sources/Daemon/Node) run in one ServiceGroup.
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
            ]
        ),
        // A finished job as an OpenTelemetry trace (SPEC §6 tracing.otlp): span descriptions with explicit
        // instants, emitted through swift-distributed-tracing to swift-otel's OTLP/HTTP exporter.
        .target(
            name: "JobTracing",
            dependencies: [
                "CShims",
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "OTel", package: "swift-otel"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        // The cluster store (SPEC §8): the schema, its named queries and the PostgreSQL driver behind one protocol.
        .target(
            name: "ClusterStore",
            dependencies: [
                "SystemCalls",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            exclude: ["SQL"]
        ),
        // The scheduler: no spool, no plists, no C codecs. Embeddable and tested on its own.
        .target(
            name: "OperationEngine",
            dependencies: [
                "CShims",
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "HeapModule", package: "swift-collections"),
            ]
        ),
        .executableTarget(
            name: "opqueued",
            dependencies: [
                "COpqueuedStart",
                "Daemon",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .executableTarget(
            name: "opqueuectl",
            dependencies: [
                "CShims",
                "ControlPlane",
                "Daemon",
                "JobModel",
                "PropertyList",
                "SpoolFiles",
                "SystemCalls",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .executableTarget(
            name: "opqueue-bench",
            dependencies: ["OperationEngine", "OperationKinds", "ControlPlane", "Daemon", "ClusterStore", "SystemdJournal", "TestSupport"],
            path: "Benchmarks/opqueue-bench"
        ),
        // The reliability campaigns (issue 5): run by `make test` at a bounded size, by `make campaigns` in full.
        .executableTarget(
            name: "opqueue-campaign",
            dependencies: ["ControlPlane", "Daemon", "OperationKinds", "SpoolFiles", "TestSupport"],
            path: "Benchmarks/opqueue-campaign"
        ),
        // Shared by the tests, the campaigns and the benchmarks.
        .target(
            name: "TestSupport",
            dependencies: ["CShims", "ControlPlane", "Daemon", "SystemCalls", "SystemdJournal",
                           .product(name: "Logging", package: "swift-log")],
            path: "Tests/Support",
            exclude: ["http_server.py", "make_pngs.py", "make_cmyk_jpegs.c", "metrics_client.py", "otlp_receiver.py"]
        ),
        // Test traits (swift-testing), for the test targets only.
        .target(name: "TestTraits", path: "Tests/Traits"),
        // Each target lists every module it imports, not one reached through another: an incremental build recompiles
        // a target when a direct dependency's struct layout changes, not always when a transitive one's does (its
        // files then keep the old size, and the struct's own code writes past it).
        .testTarget(name: "OperationEngineTests", dependencies: ["CShims", "OperationEngine", "TestTraits"]),
        .testTarget(name: "DaemonTests", dependencies: ["CShims", "ClusterStore", "ControlPlane", "Cron", "Daemon", "JobModel",
                                                        "OperationEngine", "OperationKinds", "PropertyList", "SpoolFiles",
                                                        "SystemCalls", "SystemdJournal", "TestSupport", "TestTraits"]),
        // The kinds on their own: the sleep timer, the download destination check.
        .testTarget(name: "OperationKindsTests", dependencies: ["OperationKinds", "JobModel"]),
        // The control socket's typed requests and answers, on the wire and back.
        .testTarget(name: "ControlPlaneTests", dependencies: ["ControlPlane"]),
        // The journal's MESSAGE_IDs against the catalog, its field names, and its native sender against a socket of
        // its own and the real journald.
        .testTarget(name: "SystemdJournalTests", dependencies: ["SystemdJournal", "SystemCalls", "TestSupport"]),
        // Manifests, the configuration's model, the lifecycle and schedules, without the daemon.
        .testTarget(name: "JobModelTests", dependencies: ["JobModel", "Cron"]),
        .testTarget(name: "JobTracingTests", dependencies: ["JobTracing", "TestSupport", "TestTraits",
                                                            .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                                                            .product(name: "Logging", package: "swift-log")]),
        .testTarget(name: "PropertyListTests", dependencies: ["PropertyList", "TestSupport"]),
        // Cron parsing, next and latest occurrences, and DST in real zones, as tables.
        .testTarget(name: "CronTests", dependencies: ["Cron"]),
        .testTarget(name: "ClusterStoreTests", dependencies: ["ClusterStore", "TestSupport", "TestTraits",
                                                              .product(name: "PostgresNIO", package: "postgres-nio")]),
        // SPEC §8 from outside: real nodes on one throwaway PostgreSQL (Tests/Support/ClusterHarness.swift).
        .testTarget(name: "ClusterTests", dependencies: ["TestSupport", "TestTraits"]),
    ]
)
