"""The service's HTTP side: routes, request and response models, who is calling, and the pages."""
