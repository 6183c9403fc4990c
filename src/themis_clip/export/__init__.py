"""Model building and export (optional extra ``[export]``; the core never imports this)."""
