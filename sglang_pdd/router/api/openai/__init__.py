"""The OpenAI endpoints: request shapes (`shapes`), sglang's own chat layer run over PDD's
dispatcher (`sglang_server`, `chat`), and the stitched stream as that layer reads it (`feed`)."""
