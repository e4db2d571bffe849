// What the job machine answers to each event: one enum per event, so that the shell handles every outcome of that
// event and nothing else (the compiler checks it), rather than a list of actions any event might return.

extension JobLifecycle {
    /// `received`: whether the job entered the table, and what to log for it (a job resumed from active/ logs
    /// nothing; one claimed from the inbox is `received`, one the store claimed for this node `claimed`).
    package enum ReceivedResult: Sendable, Equatable {
        case entered(announce: JournalEntry?)
        /// Already in the table: not received twice.
        case ignore
    }

    /// `delayed`: log `accepted` then `delayed`; the job waits without a slot.
    package enum DelayedResult: Sendable, Equatable {
        case waits(announce: [JournalEntry])
        /// It was not waiting for its plan.
        case ignore
    }

    /// `rejected`: log the rejection and publish the job `rejected` with `error`.
    package enum RejectedResult: Sendable, Equatable {
        case publish(announce: JournalEntry, error: String)
        /// It was not being read or accepted (lost, or ended, meanwhile).
        case ignore
    }

    /// `submitted`: the group is the job's; the cancels asked since `takeEarlyCancels` go to the engine, in order
    /// (nil: the whole group, else an operation's id).
    package enum SubmittedResult: Sendable, Equatable {
        case running(group: Group, cancels: [String?])
        /// The job was not waiting for its group (not expected): cancel the group; it is released and the job's
        /// folder discarded when it ends.
        case stray(cancel: Group)
    }

    /// `groupFinished`: publish the job, or finish a lost job's folder now that nothing runs in it.
    package enum GroupFinishedResult: Sendable, Equatable {
        case publish(job: String, status: JobStatus, error: String?)
        /// The group of a job lost while it ran: release it, then end the job's folder.
        case lostEnded(job: String, release: Group, LostEnd)
        /// No job of this machine runs the group.
        case ignore
    }

    /// `published`: the job left the table; its group (if it had one) may be released.
    package enum PublishedResult: Sendable, Equatable {
        case left(release: Group?)
        /// It was not finishing or rejected.
        case ignore
    }

    /// `lost`: log it; nothing is published for it.
    package enum LostResult: Sendable, Equatable {
        /// Its group runs: cancel it; its folder's end comes with `groupFinished` (`lostEnded`).
        case cancelFirst(announce: JournalEntry, group: Group)
        /// Nothing of it runs: release its group if it had one, and end its folder now.
        case endNow(announce: JournalEntry, release: Group?, LostEnd)
        /// Not in the table.
        case ignore
    }

    /// What becomes of a lost job's folder.
    package enum LostEnd: Sendable, Equatable {
        /// Removed with its downloads: nothing is published for it.
        case discard
        /// Given back to the store to be submitted again (its downloads go).
        case resubmit
    }
}
