// What a client hands the engine: operations described by value, dependencies by index.
//
// A graph is built in flat arrays (one spec per operation, dependencies in one shared list) so that
// a million operations cost a handful of allocations, and the engine adopts those arrays as they are.

/// The value an operation produced, read by its dependents as their `input`.
public typealias OperationOutput = any Sendable

/// Identifies a named queue of an engine.
public struct QueueID: Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int
    init(_ rawValue: Int) { self.rawValue = rawValue }
    public var description: String { "queue#\(rawValue)" }
}

/// The work of an operation.
public enum OperationBody: Sendable {
    /// Runs on a worker thread of the operation's QoS; checks `context.isCancelled` cooperatively.
    /// Returning is success (with an optional output), throwing is failure.
    case sync(@Sendable (OperationContext) throws -> OperationOutput?)
    /// Starts work and returns at once; the work calls `context.finish(_:)` later, from any thread.
    /// Holds a queue slot but no thread while it runs.
    case async(@Sendable (OperationContext) -> Void)
}

extension OperationBody {
    /// Calls the body: a synchronous one returns its output, an asynchronous one returns nil at once.
    @inline(never)
    func call(_ context: OperationContext) throws -> OperationOutput? {
        switch self {
        case .sync(let body): return try body(context)
        case .async(let body): body(context); return nil
        }
    }
}

/// One operation of a graph.
public struct OperationSpec: Sendable {
    public var name: String
    public var queue: QueueID
    /// The operation's own QoS; `nil` falls back to the group's, then the queue's.
    public var qualityOfService: QualityOfService?
    public var queuePriority: QueuePriority
    /// One attempt's limit in seconds; at expiry the attempt fails with a timeout error.
    public var timeout: Double?
    /// Further attempts after a failure.
    public var retries: Int
    /// Delay before the first retry, doubled for each next one.
    public var retryDelay: Double
    /// Run once every dependency finished, however it ended (Foundation's rule) instead of being cancelled.
    public var runsAfterFailure: Bool
    /// Index (in the group) of the dependency whose output is this operation's input;
    /// `nil`: the first dependency, in dependency order, that has an output.
    public var input: Int?
    public var body: OperationBody

    public init(
        name: String,
        queue: QueueID,
        qualityOfService: QualityOfService? = nil,
        queuePriority: QueuePriority = .normal,
        timeout: Double? = nil,
        retries: Int = 0,
        retryDelay: Double = 1,
        runsAfterFailure: Bool = false,
        input: Int? = nil,
        body: OperationBody
    ) {
        self.name = name
        self.queue = queue
        self.qualityOfService = qualityOfService
        self.queuePriority = queuePriority
        self.timeout = timeout
        self.retries = retries
        self.retryDelay = retryDelay
        self.runsAfterFailure = runsAfterFailure
        self.input = input
        self.body = body
    }
}

/// A graph of operations to submit as one group (a job), or to add to a running group.
///
/// Operations are numbered in the order they are added, from `base` (0 for a new group, the group's
/// operation count when extending one). Dependencies name those numbers; extending a group may also
/// name its earlier operations. The builder stores operations in the engine's own compact layout,
/// and the engine adopts its arrays without copying them.
public struct GraphBuilder: Sendable {
    public let base: Int
    var nodes: [Scheduler.Node] = []
    /// One body while all operations share it (`Bodies`).
    var bodies = Bodies()
    /// Names up to the last named operation (`Names`): a graph of unnamed operations keeps none.
    var names = Names()
    var options: [Scheduler.Options] = []
    /// Each operation's index in `options`, and its `input` (-1: none).
    var optionIndex = SparseColumn()
    var inputs = SparseColumn()
    /// `dependencyStart[i] ..< dependencyStart[i + 1]` is operation i's slice of `dependencies`.
    var dependencyStart: [Int32] = [0]
    var dependencies: [Int32] = []
    var problems: [String] = []
    /// The highest queue number an operation names: `prepare` checks the queues against it, not against every node.
    var highestQueue: UInt16 = 0

    public init(base: Int = 0) { self.base = base }

    public var count: Int { nodes.count }

    /// Room for so many operations and dependencies; a large graph's arrays on huge pages (`HugePages.swift`).
    public mutating func reserveCapacity(operations: Int, dependencies: Int) {
        nodes.reserveOnHugePages(operations)
        bodies.expected = operations
        names.expected = operations
        dependencyStart.reserveOnHugePages(operations + 1)
        self.dependencies.reserveOnHugePages(dependencies)
    }

    /// Adds an operation that depends on the given operations (by number; cycles are refused at
    /// submission). Returns its number.
    @discardableResult
    public mutating func add(_ spec: OperationSpec, dependencies: some Sequence<Int> = EmptyCollection()) -> Int {
        for dependency in dependencies { self.dependencies.append(Int32(truncatingIfNeeded: dependency)) }
        return appendOperation(spec)
    }

    /// `add` for an array: the generic one, called from another module, walks its sequence through
    /// witness tables, a cost per dependency that a million-operation graph notices.
    @discardableResult
    public mutating func add(_ spec: OperationSpec, dependencies: [Int]) -> Int {
        for dependency in dependencies { self.dependencies.append(Int32(truncatingIfNeeded: dependency)) }
        return appendOperation(spec)
    }

    /// Adds the operation whose dependencies were just appended.
    private mutating func appendOperation(_ spec: OperationSpec) -> Int {
        if spec.timeout != nil || spec.retries != 0 {
            if spec.retries < 0 || spec.retries >= Int(UInt16.max) {
                problems.append("operation '\(spec.name)': retries must be 0…\(Int(UInt16.max) - 1)")
            }
            if let t = spec.timeout, !(t > 0) || !t.isFinite {
                problems.append("operation '\(spec.name)': timeout must be a positive number of seconds")
            }
            if !(spec.retryDelay >= 0) || !spec.retryDelay.isFinite {
                problems.append("operation '\(spec.name)': retry delay must be 0 or more seconds")
            }
            optionIndex.set(Int32(self.options.count), at: nodes.count)
            self.options.append(Scheduler.Options(timeout: spec.timeout, retries: max(0, spec.retries), retryDelay: spec.retryDelay))
        }
        if spec.queue.rawValue < 0 || spec.queue.rawValue > Int(UInt16.max) {
            problems.append("operation '\(spec.name)': unknown queue \(spec.queue)")
        }
        var node = Scheduler.Node(
            pending: 0, epoch: 0,
            queue: UInt16(truncatingIfNeeded: spec.queue.rawValue),
            requestedQoS: spec.qualityOfService?.rawValue ?? Scheduler.noQoS, priority: spec.queuePriority)
        if spec.runsAfterFailure { node.flags |= Scheduler.Node.runsAfterFailure }
        highestQueue = max(highestQueue, node.queue)
        if let input = spec.input { inputs.set(Int32(truncatingIfNeeded: input), at: nodes.count) }
        nodes.append(node)
        bodies.append(spec.body)
        names.set(spec.name, at: nodes.count - 1)
        dependencyStart.append(Int32(dependencies.count))
        return base + nodes.count - 1
    }

    public func dependencies(of operation: Int) -> ArraySlice<Int32> {
        let local = operation - base
        return dependencies[Int(dependencyStart[local]) ..< Int(dependencyStart[local + 1])]
    }

    public func name(of operation: Int) -> String { names[operation - base] }
}

/// Operations' names, held up to the last one that is not empty; those after it read as "". A million unnamed
/// operations (closures submitted in bulk) then cost no 16 MB of empty strings, memory the kernel must hand over
/// and clear page by page.
struct Names {
    private var stored: [String] = []
    /// Room to make at the first name (`GraphBuilder.reserveCapacity`).
    var expected = 0

    subscript(_ index: Int) -> String { index < stored.count ? stored[index] : "" }

    /// Sets operation `index`'s name (its place and all before it written, once a name is not empty).
    /// Inlined for the common case, an unnamed operation past the last named one: nothing to do.
    @inline(__always)
    mutating func set(_ name: String, at index: Int) {
        if index >= stored.count && name.isEmpty { return }
        store(name, at: index)
    }

    private mutating func store(_ name: String, at index: Int) {
        if index < stored.count {
            stored[index] = name
            return
        }
        guard !name.isEmpty else { return }
        if stored.isEmpty && expected > index { stored.reserveOnHugePages(expected) }
        stored.append(contentsOf: repeatElement("", count: index - stored.count))
        stored.append(name)
    }

    /// `other`'s names placed from `index` on.
    mutating func set(_ other: Names, from index: Int) {
        for (k, name) in other.stored.enumerated() { set(name, at: index + k) }
    }
}

/// Operations' bodies. Operations submitted in bulk mostly share one closure: while they all do, it is kept once with
/// a count, and a million of them cost no 24 MB array (memory the kernel must hand over and clear page by page) and
/// no retain each. The first body that differs writes the array out.
struct Bodies {
    /// The body of every operation so far, while they share one; nil once `stored` holds them (or with none).
    private var shared: OperationBody?
    /// Each operation's body, once they differ.
    private var stored: [OperationBody] = []
    private(set) var count = 0
    var isShared: Bool { shared != nil }
    /// Room to make when the array is written out (`GraphBuilder.reserveCapacity`).
    var expected = 0

    subscript(_ index: Int) -> OperationBody {
        if let shared { return shared }
        return stored[index]
    }

    @inline(__always)
    mutating func append(_ body: OperationBody) {
        if let shared, body.isSame(as: shared) {
            count += 1
        } else if count == 0 {
            shared = body
            count = 1
        } else {
            appendDiffering(body)
        }
    }

    /// A body unlike the shared one (or any, once they differ): the array, written out if it was not.
    private mutating func appendDiffering(_ body: OperationBody) {
        if let body = shared.take() {
            stored.reserveOnHugePages(max(expected, count + 1))
            stored.append(contentsOf: repeatElement(body, count: count))
        }
        stored.append(body)
        count += 1
    }

    mutating func append(contentsOf other: Bodies) {
        for index in 0..<other.count { append(other[index]) }
    }
}

extension OperationBody {
    /// Whether two bodies are the same closure, bit for bit: the same function with the same context (what it
    /// captured, held alive by the body kept), so calling either does the same. Closures made apart that do the
    /// same compare different, which costs only memory.
    @inline(__always)
    func isSame(as other: OperationBody) -> Bool {
        withUnsafeBytes(of: self) { a in
            withUnsafeBytes(of: other) { b in
                var k = 0
                while k + 8 <= a.count {
                    if a.loadUnaligned(fromByteOffset: k, as: UInt64.self) != b.loadUnaligned(fromByteOffset: k, as: UInt64.self) {
                        return false
                    }
                    k += 8
                }
                while k < a.count {
                    if a[k] != b[k] { return false }
                    k += 1
                }
                return true
            }
        }
    }
}

/// A number per operation that most leave at -1 (an index of options, an input): no array until one is set, then one
/// up to the last set, those after it reading -1 (as `Names`).
struct SparseColumn {
    private(set) var stored: [Int32] = []

    subscript(_ index: Int) -> Int32 { index < stored.count ? stored[index] : -1 }

    mutating func set(_ value: Int32, at index: Int) {
        if index >= stored.count {
            guard value != -1 else { return }
            stored.append(contentsOf: repeatElement(-1, count: index + 1 - stored.count))
        }
        stored[index] = value
    }

    /// `other`'s values placed from `index` on, each not -1 plus `offset`.
    mutating func set(_ other: SparseColumn, from index: Int, adding offset: Int32 = 0) {
        for (k, value) in other.stored.enumerated() where value != -1 { set(value + offset, at: index + k) }
    }
}

/// What a running operation sees: its input, its attempt, and whether it should stop.
public struct OperationContext: Sendable {
    let host: any ContextHost
    let current: Attempt
    /// 1 for the first attempt.
    public var attempt: Int { current.number }
    /// The output of the operation's input dependency, if any.
    public let input: OperationOutput?
    public let name: String

    /// True once the operation was cancelled, its attempt timed out, or its group's deadline passed.
    /// Synchronous bodies check it between units of work and return (or throw) early.
    public var isCancelled: Bool { host.isCancelled(current) }

    /// Ends an asynchronous operation's attempt. Later calls, and calls after a cancellation or
    /// timeout already ended the attempt, are ignored.
    public func finish(_ result: Result<OperationOutput?, any Error>) {
        host.complete(current, result: result)
    }

    /// Registers what to do when an executing asynchronous operation is cancelled or times out
    /// (abort a transfer, cancel a timer). Called at once if that already happened.
    public func onCancel(_ handler: @escaping @Sendable () -> Void) {
        host.setCancelHandler(current, handler: handler)
    }
}

protocol ContextHost: AnyObject, Sendable {
    func isCancelled(_ attempt: Attempt) -> Bool
    func complete(_ attempt: Attempt, result: Result<OperationOutput?, any Error>)
    func setCancelHandler(_ attempt: Attempt, handler: @escaping @Sendable () -> Void)
}

/// An attempt that ran past its `timeout`.
public struct OperationTimeout: Error, CustomStringConvertible {
    public let seconds: Double
    public var description: String { "timed out after \(formatSeconds(seconds)) s" }
}

/// Thrown by bodies that stop because they were cancelled (any error thrown after cancellation counts as such).
public struct OperationCancelled: Error, CustomStringConvertible {
    public init() {}
    public var description: String { "cancelled" }
}

/// A failure that retrying cannot help (a command's exit status not listed as temporary): the operation
/// fails at once, whatever its `retries`.
public struct FinalFailure: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

func formatSeconds(_ value: Double) -> String {
    value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : String(value)
}
