mod api_objects;
mod manager;
mod smoke;
mod support;
