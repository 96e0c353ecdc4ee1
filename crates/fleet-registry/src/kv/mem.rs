#[derive(Clone, Debug)] pub struct MemKv {}
