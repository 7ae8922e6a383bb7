"""Adapters that embed cpkv in serving engines; each is imported only when used.

``import cpkv`` never imports an engine: ``cpkv.integrations.vllm`` imports vLLM (and checks its
version) when it is itself imported, which vLLM does when its OffloadingConnector loads the spec by
module path.
"""
