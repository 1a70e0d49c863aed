//! AIP's JSON-RPC vocabulary: methods and message commands.

/// An AIP JSON-RPC method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// `rpc`: request/response task messages.
    Rpc,
    /// `stream`: task messages answered with an SSE stream.
    Stream,
    /// `notification/set`: register or change a push notification config.
    NotificationSet,
    /// `notification/get`: read notification configs of a task.
    NotificationGet,
    /// `notification/delete`: delete a notification config.
    NotificationDelete,
    /// `notification/start`: start a task that reports by notification.
    NotificationStart,
    /// `group`: join a Partner to a message-queue group.
    Group,
}

impl Method {
    /// Every method, in a fixed order (used for path tables and metrics).
    pub const ALL: [Method; 7] = [
        Method::Rpc,
        Method::Stream,
        Method::NotificationSet,
        Method::NotificationGet,
        Method::NotificationDelete,
        Method::NotificationStart,
        Method::Group,
    ];

    /// The method's wire name (also its path segment under a Partner prefix).
    pub fn name(self) -> &'static str {
        match self {
            Method::Rpc => "rpc",
            Method::Stream => "stream",
            Method::NotificationSet => "notification/set",
            Method::NotificationGet => "notification/get",
            Method::NotificationDelete => "notification/delete",
            Method::NotificationStart => "notification/start",
            Method::Group => "group",
        }
    }

    /// Looks a wire name up.
    pub fn from_name(name: &str) -> Option<Method> {
        Method::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Whether the method's params carry a `message` object.
    pub fn carries_message(self) -> bool {
        matches!(
            self,
            Method::Rpc | Method::Stream | Method::NotificationStart
        )
    }

    /// Index into [`Method::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A message `command`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// Start a task.
    Start,
    /// Read a task.
    Get,
    /// Give a task more input.
    Continue,
    /// Cancel a task.
    Cancel,
    /// Accept a task's products and end it.
    Complete,
    /// Reconnect to a task's event stream.
    ReStream,
}

impl Command {
    /// The command's wire name.
    pub fn name(self) -> &'static str {
        match self {
            Command::Start => "start",
            Command::Get => "get",
            Command::Continue => "continue",
            Command::Cancel => "cancel",
            Command::Complete => "complete",
            Command::ReStream => "re-stream",
        }
    }

    /// Looks a wire name up.
    pub fn from_name(name: &str) -> Option<Command> {
        [
            Command::Start,
            Command::Get,
            Command::Continue,
            Command::Cancel,
            Command::Complete,
            Command::ReStream,
        ]
        .into_iter()
        .find(|c| c.name() == name)
    }
}
